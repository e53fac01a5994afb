import threading
from pathlib import Path

import pytest

from vigil_core import thread_names


def _comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no procfs here")
def test_a_thread_started_after_mirror_carries_its_python_name_in_the_kernel() -> None:
    seen: dict[str, int] = {}

    def remember() -> None:
        seen[threading.current_thread().name] = threading.get_native_id()
        done.wait(5)

    done = threading.Event()
    before = threading.Thread(target=remember, name="before-mirror")
    before.start()
    try:
        thread_names.mirror()
        after = threading.Thread(target=remember, name="write-behind-and-more")
        after.start()
        while len(seen) < 2:
            threading.Event().wait(0.01)
        assert _comm(seen["write-behind-and-more"]) == "write-behind-an"  # the kernel keeps 15 bytes
        assert _comm(seen["before-mirror"]) != "before-mirror"  # started before: left as it was
    finally:
        threading.setprofile(None)
        done.set()
        before.join()
        after.join()
