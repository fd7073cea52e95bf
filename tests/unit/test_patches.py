"""The patch ledger (probe_agent/patches.py): what the agent replaces is recorded, recognised,
restored only while it is still ours, and what stays is said, with why."""

from __future__ import annotations

import types

from probe_agent import patches


class Base:
    def hello(self) -> str:
        return "base"


def fresh_class() -> type:
    class Owner(Base):
        def own(self) -> str:
            return "own"

    return Owner


def test_a_replacement_is_listed_marked_and_restored():
    # GIVEN a class whose own method probe replaces
    cls = fresh_class()
    original = cls.__dict__["own"]

    def wrapper(self):
        return "wrapped " + original(self)

    # WHEN it goes through the ledger
    p = patches.replace(cls, "own", wrapper, by="test", why="a test")
    try:
        # THEN the wrapper runs, carries the one marker, and is listed by `probe info`
        assert cls().own() == "wrapped own"
        assert patches.ours(cls.own) is p and patches.ours(original) is None
        listed = [d for d in patches.describe()["patches"] if d["by"] == "test"]
        assert listed == [{"target": f"{__name__}.fresh_class.<locals>.Owner.own", "by": "test",
                           "why": "a test", "restorable": True,
                           "installed_at": round(p.installed_at, 3)}]
    finally:
        # AND restoring puts the original back and unlists it
        assert patches.restore(p) is True
    assert cls.__dict__["own"] is original and p not in patches.active()
    assert patches.restore(p) is False  # idempotent


def test_an_inherited_attribute_is_deleted_on_restore_not_copied_in():
    cls = fresh_class()
    p = patches.replace(cls, "hello", lambda self: "mine", by="test", why="inherited")
    assert cls().hello() == "mine"
    patches.restore(p)
    assert "hello" not in cls.__dict__ and cls().hello() == "base"


def test_a_wrapper_someone_put_over_ours_stays_and_is_reported():
    # GIVEN our wrapper, then someone else's over it
    mod = types.ModuleType("victim")
    mod.fn = lambda: "orig"
    p = patches.replace(mod, "fn", lambda: "ours", by="test", why="over")
    mod.fn = lambda: "theirs"
    try:
        # WHEN probe restores, THEN theirs stays (removing it would drop their wrapper) and the
        # ledger keeps listing ours (it is still in the process, under theirs)
        assert patches.restore(p) is False and mod.fn() == "theirs" and p in patches.active()
        report = patches.restore_all()
        assert {"target": "victim.fn",
                "why": "wrapped again since by someone else: theirs stays"} in report["kept"]
    finally:
        patches.forget(p)


def test_stopping_says_what_cannot_be_restored_and_why():
    mod = types.ModuleType("kept")
    mod.fn = lambda: "orig"
    p = patches.replace(mod, "fn", lambda: "ours", by="test", why="for good",
                        restorable=False, why_kept="armed once per process")
    s = patches.setting("atexit", "x", by="test", why="at exit", restorable=False,
                        why_kept="atexit keeps it")
    try:
        report = patches.restore_all()
        assert mod.fn() == "ours"
        assert {"target": "kept.fn", "why": "armed once per process"} in report["kept"]
        assert {"target": "atexit", "why": "atexit keeps it"} in report["kept"]
    finally:
        patches.forget(p)
        s.done()
    assert s not in patches.settings()


def test_a_window_is_one_record_counting_its_uses():
    a = patches.window("gc.disable()", "a moment", by="test-window", why="w")
    b = patches.window("gc.disable()", "a moment", by="test-window", why="w")
    a.uses += 2
    assert a is b and b.describe()["uses"] == 2 and b.describe()["temporary"] is True
    b.done()
