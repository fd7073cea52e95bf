"""The watchdog's 504 names a recompile: a rank whose main thread is inside torch's compiler
(read from outside the process) is "compiling", not "GIL held, probably by a C call"."""

from __future__ import annotations

from probe_agent.watchdog.compiling import compiling_note

SITE = "/venv/lib/python3.11/site-packages"


def frame(file: str, func: str, lineno: int = 1) -> dict:
    return {"file": file, "func": func, "lineno": lineno}


def read(frames: list[dict], *, main: bool = True) -> dict:
    agent = {"is_main": False, "frames": [frame("/x/probe_agent/serving/app.py", "serve")]}
    return {"threads": [agent, {"is_main": main, "frames": frames}]}


def test_a_main_thread_inside_inductor_is_compiling_and_names_the_users_line():
    # innermost first, as py-spy and faulthandler list them
    frames = [frame(f"{SITE}/torch/_inductor/codecache.py", "load", 900),
              frame(f"{SITE}/torch/_inductor/compile_fx.py", "compile_fx_inner", 700),
              frame(f"{SITE}/torch/_dynamo/eval_frame.py", "_fn", 600),
              frame(f"{SITE}/torch/nn/modules/module.py", "_call_impl", 1700),
              frame("/home/me/litgpt/pretrain.py", "fit", 42),
              frame("/home/me/litgpt/pretrain.py", "main", 10)]
    note = compiling_note(read(frames))
    assert note == ("torch.compile (torch/_inductor/codecache.py:load), called from "
                    "pretrain.py:42")


def test_no_compiler_frame_or_no_main_thread_is_not_compiling():
    plain = [frame(f"{SITE}/torch/nn/functional.py", "linear"), frame("/t/train.py", "main")]
    assert compiling_note(read(plain)) is None
    inductor = [frame(f"{SITE}/torch/_inductor/compile_fx.py", "compile_fx_inner")]
    assert compiling_note(read(inductor, main=False)) is None  # another thread compiles
    assert compiling_note({"threads": []}) is None
