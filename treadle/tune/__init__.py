"""Schedule tuning through the template protocol: parallel measurement, on-disk records.

    from treadle.tune import choose
    choice = choose(template, pattern, name, 1, target)   # served from records when present
    kernel = choice.template.emit(choice.resolved, name)
"""
from treadle.tune.choice import Choice, choose

__all__ = ["Choice", "choose"]
