"""Whether a rank whose Python does not answer is compiling (torch.compile), read from its
stacks taken outside the process: dynamo and inductor can keep the agent's threads from the
GIL for seconds, and a bare "GIL held, probably by a C call" sent the operator after a hang
that was a recompile. Pure over the reader's answer (reader.py's thread dicts)."""

from __future__ import annotations

from typing import Any

#: Path parts of torch's compiler stack: a main thread with a frame in one is compiling.
COMPILER_PATHS = ("torch/_dynamo/", "torch/_inductor/", "torch/_functorch/",
                  "torch/fx/experimental/symbolic_shapes")


def compiling_note(read: dict[str, Any]) -> str | None:
    """'torch.compile (torch/_inductor/compile_fx.py:compile_fx_inner), called from
    train.py:42' when the main thread is inside torch's compiler, else None."""
    main = next((t for t in read.get("threads") or [] if t.get("is_main")), None)
    frames = (main or {}).get("frames") or []
    files = [str(f.get("file") or "").replace("\\", "/") for f in frames]
    inner = next((i for i, p in enumerate(files) if any(c in p for c in COMPILER_PATHS)), None)
    if inner is None:
        return None
    f = frames[inner]
    path = files[inner]
    short = path[path.rindex("torch/"):] if "torch/" in path else path
    where = f"torch.compile ({short}:{f.get('func')})"
    # the user's frame that started it: the innermost frame outside torch, below the compiler
    user = next((frames[i] for i in range(inner + 1, len(frames))
                 if "/torch/" not in files[i] and "site-packages" not in files[i]), None)
    if user is not None:
        name = files[frames.index(user)].rsplit("/", 1)[-1]
        where += f", called from {name}:{user.get('lineno')}"
    return where
