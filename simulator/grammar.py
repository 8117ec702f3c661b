"""Structured output's grammar queue (SGLang's GrammarManager), for one DP rank.

A request with a `json_schema`, `regex`, `ebnf` or `structural_tag` whose grammar is not in the
backend's cache waits here, beside the waiting queue, while the backend's thread pool compiles
it; `num_grammar_queue_reqs` is this queue's length. Each miss submits its own compilation (no
sharing of one in flight); a finished one is cached under its key. The queue moves in order:
the first request whose grammar is not ready holds back every request behind it, ready or not.

SGLang's timeout (SGLANG_GRAMMAR_TIMEOUT, 300 s) counts only the polls the request at the head
waits for its own grammar, not its time in the queue: a backlog of quick compilations never
times out, only a compilation that alone outlasts it. Here the head's wait since it became the
head stands for those polls (a lower bound: a busy scheduler polls less often). A timed-out
request is aborted and its key cached as invalid, so later requests with it abort at once.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

INVALID = "invalid"


@dataclass
class GrammarQueue:
    workers: int  # the backend's compilation threads
    timeout_s: float  # SGLANG_GRAMMAR_TIMEOUT
    cache: dict[object, str] = field(default_factory=dict)  # key -> "ok" | INVALID
    queue: deque = field(default_factory=deque)  # (request, key, compiled at)
    free_at: list[float] = field(default_factory=list)  # each thread's next free time
    head_since: float = 0.0

    def __len__(self) -> int:
        return len(self.queue)

    def submit(self, req, key: object, compile_s: float, now: float) -> str:
        """'queued' (a cache miss, compiling), 'ready' (a cached grammar) or 'invalid' (a
        cached failure: the request is aborted at once)."""
        cached = self.cache.get(key)
        if cached is not None:
            return "invalid" if cached == INVALID else "ready"
        # a free thread now, else the one that frees first
        start = (now if len(self.free_at) < self.workers
                 else max(now, heapq.heappop(self.free_at)))
        heapq.heappush(self.free_at, start + compile_s)
        if not self.queue:
            self.head_since = now
        self.queue.append((req, key, start + compile_s))
        return "queued"

    def poll(self, now: float) -> tuple[list, list]:
        """(requests whose grammar is ready, requests timed out at the head), in queue order."""
        ready, timed_out = [], []
        while self.queue:
            req, key, done = self.queue[0]
            if done <= now:
                self.cache[key] = "ok"
                ready.append(req)
            elif now - self.head_since >= self.timeout_s:
                self.cache[key] = INVALID
                timed_out.append(req)
            else:
                break
            self.queue.popleft()
            self.head_since = now
        return ready, timed_out

    def next_event(self) -> float | None:
        """When the head's grammar is ready or its wait times out; None when empty."""
        if not self.queue:
            return None
        return min(self.queue[0][2], self.head_since + self.timeout_s)
