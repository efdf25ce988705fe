"""What a run shows: the console, and the same lines in ``run.log`` beside the results."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from tqdm import tqdm

LOGGER = logging.getLogger("simpipe")


class Console:
    """Prints to the terminal (unless quiet) and logs every line to the run's log file."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._file_handler: logging.Handler | None = None

    def attach_log(self, path: Path) -> None:
        self.detach_log()
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.setLevel(logging.INFO)
        self._file_handler = handler

    def detach_log(self) -> None:
        if self._file_handler is not None:
            LOGGER.removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None

    def line(self, text: str) -> None:
        LOGGER.info(text)
        if not self.quiet:
            tqdm.write(text, file=sys.stdout)

    def warn(self, text: str) -> None:
        LOGGER.warning(text)
        if not self.quiet:
            tqdm.write(f"warning: {text}", file=sys.stderr)

    def progress(self, total: int, desc: str, unit: str = "part") -> tqdm:
        # disable=None: a bar on a terminal, nothing in a batch job's log file.
        return tqdm(total=total, desc=desc, unit=unit, leave=False, unit_scale=unit == "agent",
                    disable=True if self.quiet else None, file=sys.stderr)
