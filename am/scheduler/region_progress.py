"""Which pipelined regions have finished and which may start (pure; no I/O).

A region may be scheduled once every blocking exchange it reads has all its producer regions
finished. A blocking exchange may be released (its partitions deleted on the TaskExecutors)
once every region reading it has finished.

Cost: the bookkeeping is counters per blocking exchange (a group of producer regions read by
a group of consumer regions), so a region finishing or restarting costs O(its exchanges and
their consumer regions), not O(all regions x producers), even for all-to-all edges.
"""

from __future__ import annotations

from collections.abc import Iterable

from yarnflow.am.scheduler.regions import BlockingExchange, PipelinedRegion


class RegionProgress:
    def __init__(self, regions: list[PipelinedRegion]) -> None:
        self.regions = regions
        self.finished: set[int] = set()
        self.released: set[int] = set()    # regions whose blocking outputs were all released
        self._done = {r.region_id: 0 for r in regions}
        exchanges = {id(x): x for r in regions for x in r.produced_exchanges}
        self._producers_left = {k: len({p.region_id for p in x.producer_regions}) for k, x in exchanges.items()}
        self._consumers_left = {k: len({c.region_id for c in x.consumer_regions}) for k, x in exchanges.items()}
        self._inputs_waiting = {r.region_id: len({id(x) for x in r.consumed_exchanges if r not in x.producer_regions})
                                for r in regions}

    def inputs_ready(self, region: PipelinedRegion) -> bool:
        """Every blocking exchange the region reads is complete."""
        return self._inputs_waiting[region.region_id] == 0

    def all_finished(self) -> bool:
        return len(self.finished) == len(self.regions)

    def subtask_finished(self, region: PipelinedRegion) -> bool:
        """Count one more FINISHED subtask of ``region``; True when that finished the region."""
        self._done[region.region_id] += 1
        return self._done[region.region_id] >= len(region.subtasks)

    def mark_finished(self, region: PipelinedRegion) -> tuple[list[int], list[BlockingExchange]]:
        """Book a finished region. Returns the consumer regions whose inputs are now all
        complete, and the exchanges no region needs any more (release their partitions)."""
        self.finished.add(region.region_id)
        ready: list[int] = []
        for x in region.produced_exchanges:
            self._producers_left[id(x)] -= 1
            if self._producers_left[id(x)] == 0:
                for c in x.consumer_regions:
                    if c is not region:
                        self._inputs_waiting[c.region_id] -= 1
                        if self._inputs_waiting[c.region_id] == 0:
                            ready.append(c.region_id)
        released: list[BlockingExchange] = []
        for x in region.consumed_exchanges:
            if region in x.producer_regions:
                continue
            self._consumers_left[id(x)] -= 1
            if self._consumers_left[id(x)] == 0:
                released.append(x)
                for p in x.producer_regions:
                    if all(self._consumers_left[id(y)] == 0 for y in p.produced_exchanges):
                        self.released.add(p.region_id)
        return ready, released

    def mark_unfinished(self, regions: Iterable[PipelinedRegion]) -> None:
        """The regions restart: their results are produced again and their inputs read again."""
        for region in regions:
            rid = region.region_id
            self._done[rid] = 0
            self.released.discard(rid)
            if rid not in self.finished:
                continue
            self.finished.discard(rid)
            for x in region.produced_exchanges:
                if self._producers_left[id(x)] == 0:
                    for c in x.consumer_regions:
                        if c is not region:
                            self._inputs_waiting[c.region_id] += 1
                self._producers_left[id(x)] += 1
            for x in region.consumed_exchanges:
                if region not in x.producer_regions:
                    self._consumers_left[id(x)] += 1
