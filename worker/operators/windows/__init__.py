"""Window operators: the keyed window aggregation (``aggregate``: vectorised ``vector`` and
row-by-row ``row_windows`` engines) and the window join (``join``). Window assigners are user
API, in ``yarnflow.common.api.windows``."""

from yarnflow.worker.operators.windows.aggregate import WindowAggregateOperator
from yarnflow.worker.operators.windows.common import AGG_FUNCS, WINDOW_END, WINDOW_START
from yarnflow.worker.operators.windows.join import WindowJoinOperator

__all__ = ["AGG_FUNCS", "WINDOW_END", "WINDOW_START", "WindowAggregateOperator", "WindowJoinOperator"]
