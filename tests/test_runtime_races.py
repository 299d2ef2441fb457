"""Host reads and external references against a donation of the same buffer: a read either
sees the buffer's bytes unchanged or fails with BufferDonatedError; an external reference
either blocks the donation or fails; the bytes never change under them.

The race is made deterministic: the donation runs at the worst moment, while the read waits
for the buffer to be ready (after it has found the buffer live, before it copies)."""

import threading

import numpy as np
import pytest

from xlapy.runtime import BufferDonatedError, Client, DonationError
from xlapy.runtime.futures import Future

N = 4096
BUMP = f"""HloModule bump, input_output_alias={{ {{}}: 0 }}
ENTRY e {{
  p = f32[{N}] parameter(0)
  c = f32[] constant(1)
  b = f32[{N}] broadcast(c), dimensions={{}}
  ROOT r = f32[{N}] add(p, b)
}}"""


class DonateWhileWaiting(Future):
    """A done future whose first wait (or callback) first runs `hook` (the racing
    donation)."""

    __slots__ = ("hook",)

    def __init__(self, hook):
        super().__init__()
        self._state = 1  # done
        self.hook = hook

    def _race(self):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()

    def result(self, timeout=None):
        self._race()
        return super().result(timeout)

    def add_done_callback(self, fn):
        self._race()
        super().add_done_callback(fn)


@pytest.fixture(scope="module")
def client():
    c = Client("cpu")
    yield c
    c.close()


@pytest.fixture(scope="module")
def bump(client):
    exe = client.compile(BUMP)
    warm = client.buffer_from_pyval(np.zeros(N, np.float32))
    exe.execute([[warm]], donate=[0])[0][0].block_until_ready()
    return exe


def racing_buffer(client, bump, outcome, on_thread=False):
    """A buffer of zeros that is donated to `bump` the moment a read waits for it; the
    donation's output (or error) goes to `outcome`."""
    buf = client.buffer_from_pyval(np.zeros(N, np.float32))

    def donate():
        try:
            out = bump.execute([[buf]], donate=[0])[0][0]
            outcome.append(out.block_until_ready())
        except Exception as e:  # the outcome under test
            outcome.append(e)

    def hook():
        if not on_thread:
            donate()
            return
        t = threading.Thread(target=donate)
        t.start()
        t.join(60)

    buf._ready = DonateWhileWaiting(hook)
    return buf


@pytest.mark.parametrize("on_thread", [False, True])
@pytest.mark.parametrize(
    "read",
    [
        lambda b: b.to_numpy(),
        lambda b: np.asarray(b),
        lambda b: b.copy_to_memory_space(b.device.default_memory_space).to_numpy(),
    ],
    ids=["to_numpy", "asarray", "copy_to_memory_space"],
)
def test_read_racing_a_donation_sees_the_bytes_unchanged(client, bump, read, on_thread):
    outcome: list = []
    buf = racing_buffer(client, bump, outcome, on_thread)
    try:
        got = read(buf)
    except BufferDonatedError:
        return
    (donated,) = outcome
    np.testing.assert_array_equal(donated.to_numpy(), np.ones(N, np.float32))
    np.testing.assert_array_equal(got, np.zeros(N, np.float32))


@pytest.mark.parametrize("on_thread", [False, True])
def test_external_reference_racing_a_donation_never_changes(client, bump, on_thread):
    outcome: list = []
    buf = racing_buffer(client, bump, outcome, on_thread)
    try:
        with buf.external_reference() as view:
            np.testing.assert_array_equal(view, np.zeros(N, np.float32))
    except BufferDonatedError:
        assert not isinstance(outcome[0], Exception)
        return
    (donated,) = outcome
    assert isinstance(donated, DonationError), donated
    assert "external reference" in str(donated)
