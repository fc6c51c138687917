"""TODO slots of issue #9: scenarios that wait for features being built now.

Each is listed by `run.py --list` and reported as TODO; none runs. Replace a slot with a real
`Scenario` in its own module when its feature lands (and delete it here).
"""

from __future__ import annotations

from scenarios import register
from scenarios.base import PendingScenario


class Listing(PendingScenario):
    name = "listing"
    number = 6
    title = "Listing a huge flat folder: os.scandir vs os.listdir (first entry, 50k, all)"
    todo = (
        "needs a listing dataset (100k+ names, cheap to upload) and the lazy-listing work; "
        "ceiling = list_page loop with the same client"
    )


register(Listing())
