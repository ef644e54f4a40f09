"""``greedy``: Optimus' marginal-gain allocation (Peng et al., EuroSys'18), faithfully.

1. Every job first gets its minimum if it fits, in FIFO order: running jobs start from
   their minimum (they cannot go lower: no preemption), frozen jobs from their current
   size, pending jobs from their smallest worthwhile size or nothing.
2. Then, repeatedly, one more unit goes to the job whose estimated remaining time drops
   the most per node, ``w_j * (T_j(s) - T_j(s')) / (s' - s)``, where ``s'`` is the job's
   next candidate size (one node when step = 1, one step otherwise) and ``T_j`` includes
   the resize cost when the size differs from the current one.  A job whose next size
   does not fit drops out (usage only grows, so it never fits later); the loop ends when
   no job gains.  Ties go to the older job.  Jobs that did not get their minimum get
   nothing more.
"""

from __future__ import annotations

import heapq

from slurm_elastic.policy.capacity import QueueKey
from slurm_elastic.policy.compiled import Compiled
from slurm_elastic.policy.ledger import Ledger, admit_queue_minimums


def solve_greedy(compiled: Compiled) -> list[int]:
    ledger = Ledger(compiled)
    jobs = compiled.jobs
    started = [job.demand.is_running or job.demand.frozen for job in jobs]
    for i in admit_queue_minimums(compiled, ledger):
        started[i] = True

    heap: list[tuple[float, QueueKey, int]] = []

    def push(i: int) -> None:
        job, k = jobs[i], ledger.choice[i]
        if k + 1 >= job.sizes.size:
            return
        # Python numbers (``item``), not numpy scalars: the same IEEE arithmetic, cheaper.
        left, size = job.remaining_s.item, job.sizes.item
        drop = left(k) - left(k + 1)
        gain = job.demand.weight * drop / float(size(k + 1) - size(k))
        if gain > 0:
            heapq.heappush(heap, (-gain, job.queue, i))

    # Heap keys are unique (a job is in the heap at most once, queue keys are distinct),
    # so the pop order does not depend on the push order.
    for i in range(len(jobs)):
        if started[i]:
            push(i)
    while heap:
        _, _, i = heapq.heappop(heap)
        nxt = ledger.choice[i] + 1
        if ledger.fits(i, nxt):
            ledger.move(i, nxt)
            push(i)
    return ledger.choice
