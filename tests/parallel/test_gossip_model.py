"""The gossip protocol's Promela model (src/gnnpar/parallel/gossip/protocol.pml), checked with SPIN.

SPIN explores every interleaving of the ranks' store operations: for 2, 3 and 4 ranks and small
pools, both topologies, it must find no deadlock, no failed assertion, and prove the model's LTL
properties (every rank terminates; nobody is paired with itself or two partners at once; every
pool position is trained). Then the same checks run on mutated models (the clean-up dropped, a
claim made without first turning busy, a claimed rank releasing its key before the exchange,
the pool counter read and written in two steps, the next epoch's item dropped), and SPIN must
find each counter-example: a check that cannot fail proves nothing.

Needs ``spin`` (Debian package ``spin``) and a C compiler; skipped without them, except where
GNNPAR_REQUIRE_SPIN=1 (CI), where a missing tool fails the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# SPIN, and the C compiler that builds its verifier, run as processes: the slow lane
pytestmark = pytest.mark.slow

MODEL = (
    Path(__file__).resolve().parents[2] / "src" / "gnnpar" / "parallel" / "gossip" / "protocol.pml"
)
PROPERTIES = ("terminates", "exclusive", "pool_once")


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    missing = [t for t in ("spin", "gcc") if shutil.which(t) is None]
    if missing:
        why = (
            f"{' and '.join(missing)} not found: the gossip protocol's model check needs SPIN "
            "and a C compiler (Debian: apt-get install spin gcc)"
        )
        if os.environ.get("GNNPAR_REQUIRE_SPIN") == "1":
            pytest.fail(f"{why}; GNNPAR_REQUIRE_SPIN=1 requires them")
        pytest.skip(why)


def build(folder: Path, text: str, defines: list[str], safety: bool, opt: str = "-O0") -> Path:
    """spin -a, then the verifier: a safety one (assertions, invalid end states) or one that
    checks the model's ltl claims. Compiling costs more than a small search: optimise only for
    the larger state spaces."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "protocol.pml").write_text(text)
    spin = subprocess.run(
        ["spin", "-a", *defines, "protocol.pml"], cwd=folder, capture_output=True, text=True
    )
    assert spin.returncode == 0 and (folder / "pan.c").exists(), spin.stdout + spin.stderr
    flags = ["-DSAFETY", "-DNOCLAIM"] if safety else []
    subprocess.run(
        ["gcc", opt, "-w", *flags, "-o", "pan", "pan.c"], cwd=folder, check=True, timeout=120
    )
    return folder / "pan"


def verify(pan: Path, *args: str) -> tuple[int, str]:
    """Run a verifier to the end; returns (errors, its report)."""
    out = subprocess.run(
        [str(pan), "-m20000", "-w21", *args],
        cwd=pan.parent,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    found = re.search(r"errors: (\d+)", out)
    assert found, out
    errors = int(found.group(1))
    if errors == 0:  # a clean result only counts if the whole state space was searched
        assert "max search depth too small" not in out and "Search not completed" not in out, out
    return errors, out


def defines(ranks: int, pool: int, epochs: int, *flags: str) -> list[str]:
    return [f"-DN={ranks}", f"-DPOOL={pool}", f"-DEPOCHS={epochs}", *(f"-D{f}" for f in flags)]


# ranks, pool size, epochs, model flags: 2 epochs where the state space allows, so that an item
# taken for the next epoch is held across the epoch's end (PoolSource._next); CHECKPOINT pauses
# and reopens gossip at every epoch's end but the last (--checkpoint-every 1)
CONFIGS = [
    (2, 2, 2, ()),
    (3, 2, 2, ()),
    (4, 2, 1, ()),
    (3, 2, 2, ("BIPARTITE",)),
    (4, 2, 1, ("BIPARTITE",)),
    (2, 2, 3, ("CHECKPOINT",)),
    (3, 2, 2, ("CHECKPOINT",)),
]


@pytest.mark.parametrize(
    "ranks,pool,epochs,flags",
    CONFIGS,
    ids=[f"{n}ranks-pool{p}x{e}" + "".join(f"-{x.lower()}" for x in f) for n, p, e, f in CONFIGS],
)
def test_model_has_no_deadlock_and_proves_its_properties(tmp_path, ranks, pool, epochs, flags):
    text, d = MODEL.read_text(), defines(ranks, pool, epochs, *flags)
    opt = "-O1" if ranks > 2 and "BIPARTITE" not in flags else "-O0"  # (bipartite: small)
    errors, out = verify(build(tmp_path / "safety", text, d, safety=True, opt=opt))
    assert errors == 0 and "invalid end states\t+" in out, out  # end states were checked
    pan = build(tmp_path / "ltl", text, d, safety=False, opt=opt)
    for prop in PROPERTIES:
        errors, out = verify(pan, "-a", "-N", prop)
        assert errors == 0 and f"ltl formula {prop}" in out, out


# name: (the model's text, what replaces it, the check, what SPIN must report); the checks run
# for 3 ranks, a pool of 2, 1 epoch, unless the name is in WITH (ranks, pool, epochs, pan flags)
MUTATIONS = {
    # retire sets done with store.set instead of compare_set: a claim made on it is dropped
    "no_clean_up": (
        ":: atomic { (kind[me] == AVAIL || kind[me] == DONE) -> kind[me] = DONE }",
        ":: atomic { true -> kind[me] = DONE }",
        "terminates",
        "acceptance cycle",
    ),
    "no_clean_up_safety": (
        ":: atomic { (kind[me] == AVAIL || kind[me] == DONE) -> kind[me] = DONE }",
        ":: atomic { true -> kind[me] = DONE }",
        "safety",
        "invalid end state",
    ),
    # _pick claims a partner without first turning its own key busy: it can be claimed while
    # it has a pick open (the claim's assertion removed, so that the ltl claim must catch it)
    "pick_without_busy": (
        ":: atomic { (kind[me] == AVAIL || kind[me] == BUSY) -> kind[me] = BUSY }\n",
        ":: atomic { kind[me] == AVAIL -> skip }\n",
        "exclusive",
        "assertion violated  !( !(",
    ),
    # the picked rank releases its key (avail) instead of answering ready, before the exchange
    "release_before_exchange": (
        "d_step { kind[me] = READY; who[me] = xp; num[me] = xn }   /* set ready:A:X */",
        "d_step { kind[me] = AVAIL; who[me] = 0; num[me] = 0 }",
        "safety",
        "invalid end state",
    ),
    # the pool counter read (get) and written back (set) in two steps instead of one add
    "pool_counter_get_then_set": (
        "    d_step {\n        if\n        :: held > 0 -> pos = held - 1; held = 0\n"
        "        :: else -> pos = counter; counter++\n        fi;\n",
        "    if\n    :: held > 0 -> pos = held - 1; held = 0\n"
        "    :: else -> pos = counter; counter = pos + 1\n    fi;\n    d_step {\n",
        "safety",
        "!((trained&(1<<pos)))",  # trained twice
    ),
    # PoolSource forgets the item it took for the next epoch (assertions off: the ltl claim
    # alone must see that a position is never trained)
    "drop_next_epochs_item": (
        ":: pos / POOL > epoch -> held = pos + 1 ",
        ":: pos / POOL > epoch -> skip ",
        "pool_once",
        "acceptance cycle",
    ),
}
WITH = {
    "drop_next_epochs_item": (2, 2, 2, ["-A"]),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_spin_finds_the_counter_example_of_a_mutated_model(tmp_path, name):
    old, new, check, report = MUTATIONS[name]
    ranks, pool, epochs, flags = WITH.get(name, (3, 2, 1, []))
    text = MODEL.read_text()
    assert text.count(old) == 1, f"mutation {name} no longer applies to the model"
    text = text.replace(old, new)
    if name == "pick_without_busy":
        claim_assert = "assert(r != me && inx[me] == 0 && inx[r] == 0);"
        assert text.count(claim_assert) == 1
        text = text.replace(claim_assert, "")
    pan = build(tmp_path, text, defines(ranks, pool, epochs), safety=check == "safety")
    args = flags if check == "safety" else [*flags, "-a", "-N", check]
    errors, out = verify(pan, *args)
    assert errors > 0 and report in out, out
    assert (tmp_path / "protocol.pml.trail").exists()  # the counter-example, for spin -t
