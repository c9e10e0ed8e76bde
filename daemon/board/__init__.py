"""edgepilot.board: read any board below a sysfs root; write only what DVFS profiles need."""

from edgepilot.board.board import Board, BoardSample, report
from edgepilot.board.identity import BoardIdentity

__all__ = ["Board", "BoardIdentity", "BoardSample", "report"]
