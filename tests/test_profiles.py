"""Profile files: built-ins validate on their boards; bad files name the file, key and choices."""

from __future__ import annotations

from pathlib import Path

import pytest
from board_fixtures import ALL_BOARDS, FakeBoard, any_board, fake_board, orin

from edgepilot.board import Board
from edgepilot.dvfs.profiles import ProfileStore, builtin_dir, load_file
from edgepilot.dvfs.write_plan import build_plan, limit_order, snap
from edgepilot.errors import ProfileError

__all__ = ["any_board", "fake_board", "orin"]


def test_builtin_files_exist_and_parse() -> None:
    stems = sorted(p.stem for p in builtin_dir().glob("*.toml"))
    assert stems == ["dimensity-9300", "generic", "jetson-orin", "snapdragon-8gen3"]
    for path in builtin_dir().glob("*.toml"):
        assert load_file(path).raw


def test_every_builtin_profile_validates_on_its_board(any_board: FakeBoard) -> None:
    board = Board(any_board.root)
    profiles = ProfileStore().for_board(board.identity)
    assert {"performance", "balanced", "powersave"} <= set(profiles)
    for prof in profiles.values():
        plan = build_plan(prof, board)
        assert plan.targets, prof.name


def test_family_overrides_generic_and_extends_resolves(orin: FakeBoard) -> None:
    profiles = ProfileStore().for_board(Board(orin.root).identity)
    perf = profiles["performance"]
    assert perf.source.name == "jetson-orin.toml" and perf.spec.nvpmodel == 0
    assert perf.chain == ["performance"]  # generic:performance
    assert perf.spec.cpu["*"].governors == ["performance", "schedutil"]  # inherited
    assert profiles["balanced"].chain == ["maxn"]


def test_snapping_percentages_and_descending_tables(fake_board) -> None:  # type: ignore[no-untyped-def]
    board = Board(fake_board("mt6989").root)  # tables printed highest-first
    prof = ProfileStore().for_board(board.identity)["powersave"]
    plan = {t.name: t for t in build_plan(prof, board).targets}
    # policy4 range 622000..2850000, 60% = 1958800 -> nearest entry 1950000
    assert plan["policy4"].max == 1950000 and plan["policy4"].min == 622000
    # fastest = policy7 (3.25 GHz): 50% of 1000000..3250000 = 2125000, a tie between
    # 2050000 and 2200000 that goes to the lower entry
    assert plan["policy7"].max == 2050000
    assert plan["13000000.mali"].max == 780000000  # 50% of 260..1300 MHz
    assert snap(1958800, (1800000, 1950000, 2100000)) == 1950000
    assert snap(5, ()) == 5


def test_pin_without_userspace_governor_is_min_equals_max(fake_board) -> None:  # type: ignore[no-untyped-def]
    board = Board(fake_board("mt6989").root)
    prof = ProfileStore().for_board(board.identity)["inference"]
    pol0 = next(t for t in build_plan(prof, board).targets if t.name == "policy0")
    assert pol0.min == pol0.max == 1500000 and pol0.setspeed is None


def test_pin_with_userspace_uses_setspeed(tmp_path: Path, fake_board) -> None:  # type: ignore[no-untyped-def]
    from board_fixtures import three_policy_board

    board = Board(fake_board(three_policy_board()).root)
    d = tmp_path / "p"
    d.mkdir()
    (d / "generic.toml").write_text('[profiles.fixed.cpu.policy2]\npin = 1800000\n')
    plan = build_plan(ProfileStore([d]).for_board(board.identity)["fixed"], board)
    assert [(t.name, t.governor, t.setspeed) for t in plan.targets] == \
        [("policy2", "userspace", 1800000)]


def write(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    (d / "generic.toml").write_text(text)
    return d


@pytest.mark.parametrize(("text", "where", "allowed"), [
    ('[profiles.x.cpu."*"]\ngovernor = "turbo"\n', "profiles.x.cpu.*.governor",
     "ondemand, userspace, powersave, performance, schedutil"),
    ('[profiles.x.cpu."*"]\nmax = 99\n', "profiles.x.cpu.*.max", "1500000..2400000 kHz"),
    ('[profiles.x.cpu."*"]\nmax = "fast"\n', "profiles.x.cpu.*.max", '"min" or "max"'),
    ('[profiles.x.cpu."*"]\nmaxx = "max"\n', "profiles.x.cpu.*.maxx", "unknown key"),
    ('[profiles.x.cpu.policy9]\nmax = "max"\n', "profiles.x.cpu.policy9", "present: policy0"),
    ('[profiles.x.cpu.bigcores]\nmax = "max"\n', "profiles.x.cpu.bigcores", '"policyN"'),
    ('[profiles.x.cpu."*"]\nmin = "max"\nmax = "min"\n', "profiles.x.cpu.*", "min <= max"),
    ('[profiles.x.devfreq.foo]\nmax = "max"\n', "profiles.x.devfreq.foo", '"gpu"'),
    ('[profiles.x]\nextends = "nope"\n', "profiles.x.extends", "allowed: "),
    ('[profiles.x]\nnvpmodel = 2\n', "profiles.x.nvpmodel", "need a Jetson"),
    ('[profiles.x]\nextends = "y"\n[profiles.y]\nextends = "x"\n', "extends", "loops"),
])
def test_invalid_profiles_name_file_key_and_allowed(tmp_path: Path, fake_board, text: str,  # type: ignore[no-untyped-def]
                                                    where: str, allowed: str) -> None:
    board = Board(fake_board("rpi5").root)
    d = write(tmp_path, text)
    with pytest.raises(ProfileError) as exc:
        for prof in ProfileStore([d]).for_board(board.identity).values():
            build_plan(prof, board)
    msg = exc.value.message
    assert str(d / "generic.toml") in msg, msg
    assert where in msg or where in (exc.value.field or ""), msg
    assert allowed in msg, msg


def test_nvpmodel_mode_by_name_and_unknown_mode(tmp_path: Path, orin: FakeBoard) -> None:
    board = Board(orin.root)
    d = tmp_path / "p"
    d.mkdir()
    (d / "jetson-orin.toml").write_text('[profiles.a]\nnvpmodel = "10W"\n'
                                        '[profiles.b]\nnvpmodel = 7\n')
    profiles = ProfileStore([d]).for_board(board.identity)
    assert build_plan(profiles["a"], board).nvpmodel == 1
    with pytest.raises(ProfileError, match=r"allowed: 0 \(MAXN\), 1 \(10W\), 2 \(15W\), 3 \(25W\)"):
        build_plan(profiles["b"], board)


def test_bad_toml_and_unknown_top_level_key(tmp_path: Path) -> None:
    bad = tmp_path / "a.toml"
    bad.write_text("[profiles.x\n")
    with pytest.raises(ProfileError, match=f"{bad}: not valid TOML"):
        load_file(bad)
    bad.write_text('profile = "x"\n')
    with pytest.raises(ProfileError, match="unknown top-level key 'profile'; allowed"):
        load_file(bad)


def test_limit_order_follows_kernel_rules() -> None:
    assert limit_order(700, 1000, 1200, 1500) == ["max", "min"]   # raise: max first
    assert limit_order(700, 1000, 300, 500) == ["min", "max"]     # lower: min first
    assert limit_order(700, 1000, None, 1500) == ["max"]


@pytest.mark.parametrize("board_name", ALL_BOARDS)
def test_generic_profiles_work_everywhere(fake_board, board_name: str) -> None:  # type: ignore[no-untyped-def]
    board = Board(fake_board(board_name).root)
    generic = ProfileStore().for_board(board.identity.__class__(None, ()))
    for prof in generic.values():
        assert build_plan(prof, board).targets
