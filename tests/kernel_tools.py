"""Running one cell in a real sandboxed kernel, started as the grader starts it."""

from __future__ import annotations


async def run_in_kernel(box, code: str, timeout: float = 60) -> dict:
    """Start a kernel in ``box`` (:class:`autograder.sandbox.Sandbox`), run ``code``, end the
    kernel: the reply's status, what the cell printed, and the kernel's host PID if the zygote
    forked it (None: started cold)."""
    from autograder.executor import SandboxedKernelManager

    km = SandboxedKernelManager.in_sandbox(box)
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        printed = []
        reply = await client.execute_interactive(code, timeout=timeout, output_hook=lambda m: printed.append(
            m["content"].get("text", "")))
        return {"status": reply["content"]["status"], "printed": "".join(printed), "forked_pid": km.forked_pid}
    finally:
        client.stop_channels()
        await km.shutdown_kernel(now=True)
