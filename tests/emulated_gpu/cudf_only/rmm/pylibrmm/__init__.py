"""Emulated ``rmm.pylibrmm``: the stream wrapper pylibcudf takes."""

__emulated__ = True
