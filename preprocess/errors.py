"""Typed errors of the preprocessing library.

Every error a user can cause ends in exactly one subclass of
:class:`PreprocessError`; its message names the input, the cause and the fix.
Errors carry only their message so they pickle across worker processes.
"""

from __future__ import annotations


class PreprocessError(Exception):
    """Base class: a document could not be preprocessed, for a stated reason."""


class UnsupportedFileType(PreprocessError):
    """The content is not one of the supported kinds (PDF, PNG, JPEG, TIFF, WebP, BMP)."""


class MislabelledFile(UnsupportedFileType):
    """The file name's extension disagrees with the sniffed content (strict mode only)."""


class UnsafeFilename(PreprocessError):
    """A file name holds path components, control characters or is empty."""


class FileTooLarge(PreprocessError):
    """The input is bigger than ``PreprocessOptions.max_file_bytes``."""


class PasswordRequired(PreprocessError):
    """The PDF is encrypted and no password was given."""


class WrongPassword(PasswordRequired):
    """The PDF is encrypted and the given password does not open it."""


class CorruptDocument(PreprocessError):
    """The file is damaged beyond what MuPDF or Pillow can repair."""


class EmptyDocument(PreprocessError):
    """The document has zero pages."""


class TooManyPages(PreprocessError):
    """The document has more pages than ``PreprocessOptions.max_pages``."""


class ImageTooLarge(PreprocessError):
    """An image has more pixels than the limit (a possible decompression bomb)."""


class PageTimeout(PreprocessError):
    """One page took longer than ``PreprocessOptions.page_timeout_s``."""


class OcrUnavailable(PreprocessError):
    """Tesseract is not installed or its language data is missing."""


class OcrFailed(PreprocessError):
    """Tesseract ran but failed on a page."""


class StorageFull(PreprocessError):
    """The data directory's disk (or quota) has no room left to store the document."""


class InputNotFound(PreprocessError):
    """The path given does not exist or is not a file."""
