"""A joiner whose site holds no worker of its stage starts from the seed while the stage has
taken no outer step, rather than wait for a state to cross the slow link between sites."""

from __future__ import annotations

import pytest

from workers.outer.bootstrap import seeds_in_its_site


@pytest.mark.parametrize(("donor_sites", "site", "high_water", "seeds"), [
    (["b", "b"], "a", 0, True),  # nobody here, the stage untrained: the seed
    (["b", "a"], "a", 0, False),  # a donor of our site: its state, over a fast link
    (["b", "b"], "a", 3, False),  # the stage trained: its state, whatever the link
    (["b", "b"], "a", None, False),  # Redis not answering: the stage may be past step 0
    (["b", "b"], "", 0, False),  # no site named: every donor is as near as any
    ([], "a", 0, True),
])
def test_the_seed_only_for_the_first_of_an_untrained_stage_in_its_site(donor_sites, site, high_water, seeds):
    asked = []

    def mark() -> int | None:
        asked.append(1)
        return high_water

    assert seeds_in_its_site(donor_sites, site, mark) is seeds
    assert asked == ([1] if site and site not in donor_sites else [])  # Redis asked only when it decides
