"""Schedule tuning through the template protocol: parallel measurement, on-disk records.

    from treadle.tune import choose
    choice = choose(template, pattern, name, level=1)   # served from records when present
    kernel = choice.template.emit(choice.resolved, name)
"""
from treadle.tune.exhaustive import Choice, choose

__all__ = ["Choice", "choose"]
