"""Errors a user can act on: one sentence saying what is wrong and what to do."""


class DFlashError(Exception):
    """A problem with user input (files, configs, settings); shown without a traceback."""


class CheckpointError(DFlashError):
    """A model or drafter checkpoint that cannot be used."""


class IncompatiblePairError(DFlashError):
    """A drafter that does not fit the chosen target."""


class SettingsError(DFlashError):
    """Generation settings outside what makes sense."""


class LoadCancelled(DFlashError):
    """The user cancelled a load (between stages, or during a download)."""
