"""TODO slots of issue #9: scenarios that wait for features being built now.

Each is listed by `run.py --list` and reported as TODO; none runs. Replace a slot with a real
`Scenario` in its own module when its feature lands (and delete it here). None is open now; for
the next one, subclass `scenarios.base.PendingScenario` here and `register()` it.
"""
