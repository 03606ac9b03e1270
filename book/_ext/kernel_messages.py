"""Sphinx extension: the book's pages wait for their kernels' replies in slices of a second
(course/kernel_messages.py says why: a missed wake-up once held a page for 300 s)."""

from course.kernel_messages import install


def setup(app):
    install()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
