"""A kernel's reply that has come is read within a second, even when the socket's wake-up
is missed (course/kernel_messages.py): the book once waited 300 s for one."""

from __future__ import annotations

import asyncio
from queue import Empty

import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from course import kernel_messages


@pytest.fixture
def channel():
    """An asyncio channel reading what a plain socket sends it, and that socket's session."""
    kernel_messages.install()
    context = zmq.asyncio.Context()
    reader = context.socket(zmq.PAIR)
    port = reader.bind_to_random_port("tcp://127.0.0.1")
    writer = zmq.Context.instance().socket(zmq.PAIR)
    writer.connect(f"tcp://127.0.0.1:{port}")
    session = Session()
    yield AsyncZMQSocketChannel(reader, session), session, writer
    writer.close(linger=0)
    reader.close(linger=0)
    context.term()


def _polls(channel, missed: int):
    """Record the time limit of each poll of the channel's socket; the first ``missed``
    polls miss their wake-up: they report nothing whatever the socket holds."""
    asked, real = [], channel.socket.poll

    def poll(timeout=None, flags=zmq.POLLIN):
        asked.append(timeout)
        if len(asked) <= missed:
            future = asyncio.get_running_loop().create_future()
            future.set_result(0)
            return future
        return real(timeout, flags)

    channel.socket.poll = poll
    return asked


def test_a_reply_whose_wake_up_was_missed_is_read_at_the_next_slice(channel):
    reader, session, writer = channel
    session.send(writer, "execute_reply", {"status": "ok"})
    asked = _polls(reader, missed=1)
    msg = asyncio.run(reader.get_msg(timeout=30))
    assert msg["content"] == {"status": "ok"}
    assert len(asked) == 2 and all(t <= kernel_messages.SLICE * 1000 for t in asked), asked


def test_no_reply_is_empty_once_the_whole_limit_has_passed(channel):
    reader, _, _ = channel
    asked = _polls(reader, missed=0)
    with pytest.raises(Empty):
        asyncio.run(reader.get_msg(timeout=2.5))
    assert len(asked) >= 3 and all(t <= kernel_messages.SLICE * 1000 for t in asked), asked
    with pytest.raises(Empty):
        asyncio.run(reader.get_msg(timeout=0))


def test_installing_twice_wraps_once():
    kernel_messages.install()
    first = AsyncZMQSocketChannel.get_msg
    kernel_messages.install()
    assert AsyncZMQSocketChannel.get_msg is first and first.sliced
