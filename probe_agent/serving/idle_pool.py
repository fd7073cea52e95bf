"""IdlePool: a thread pool whose threads end after a while without work.

The agent's request pools (queries, evals) were ``ThreadPoolExecutor``s: each thread, once a
burst of requests had started it, stayed in the training process for good (four query threads
after one ``probe`` fan-out). Here a thread that has waited ``idle_s`` with nothing queued ends,
as anyio's worker threads do after 10 s, so a quiet agent is back to its own few threads while
a burst still gets ``max_workers`` at once.

Counting: ``_idle`` is the number of waiting threads not yet promised to a queued call. A
submit takes one of those or starts a thread (up to ``max_workers``); a thread ends only when
the queue is empty, checked under the same lock that submit queues under, so no call is ever
left without a thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from .. import cpu_priority

#: Seconds a thread waits for work before it ends (anyio's worker threads use 10 s).
IDLE_S = 10.0


class IdlePool(Executor):
    """Args:
        background: run each task with the CPU yielded to training at this level
            (cpu_priority.py: 'idle' or 'nice'): for bulk work only (SQL), never for what must
            answer at once on a busy job."""

    def __init__(self, max_workers: int, name: str, idle_s: float = IDLE_S,
                 background: str | None = None) -> None:
        self._background = background
        self._max = max_workers
        self._name = name
        self._idle_s = idle_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: live threads (agent.stop joins them)
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._started = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name}: cannot schedule new calls after shutdown")
            self._queue.put((fut, fn, args, kwargs))
            if self._idle > 0:
                self._idle -= 1
            elif len(self._threads) < self._max:
                self._started += 1
                th = threading.Thread(target=self._work, name=f"{self._name}_{self._started}",
                                      daemon=True)
                self._threads.add(th)
                th.start()
        return fut

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                item = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._idle = max(0, self._idle - 1)
                        self._threads.discard(me)
                        return
                continue
            if item is None:  # shutdown
                with self._lock:
                    self._threads.discard(me)
                return
            fut, fn, args, kwargs = item
            if self._background:
                cpu_priority.background(self._background)
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # the caller's to see, on its future
                    fut.set_exception(e)
                else:
                    fut.set_result(result)
            del item, fut, fn, args, kwargs
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in threads:
                self._queue.put(None)
        if wait:
            for th in threads:
                th.join()
