"""Error types that map to the CLI's exit codes (0 ok, 1 failure, 2 bad usage or input)."""


class BigknnError(Exception):
    """A failure while doing the work (exit code 1)."""

    exit_code = 1


class BadInput(BigknnError):
    """Bad input or usage (exit code 2); the message names the file and the problem in one line."""

    exit_code = 2

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class StoreBusy(BigknnError):
    """Another writer holds the store's lock."""

    exit_code = 1


class Damaged(BigknnError):
    """A store file is missing or fails its checksum (exit 1): reads stop here, they never return zeros.
    ``where`` names the shard and array, ``file`` the file; ``bigknn verify`` lists every such file and what
    repairs it."""

    exit_code = 1

    def __init__(self, file: object, problem: str, where: str = ""):
        self.file = str(file)
        self.problem = problem
        self.where = where
        super().__init__(f"{where}: {self.file}: {problem}" if where else f"{self.file}: {problem}")
