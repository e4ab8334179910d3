"""The fault plugin's hostile modes in Python (tests/plugins/fault is the
Rust one): the containment bench and tests/polyglot.rs check that a Python
plugin is held to the same bounds. Config: `fault` picks the mode; `count`,
`size_bytes`, `secs`, `destination`, `message` as for the Rust plugin."""

import sys
import time

from hub_plugin import Config, Event, Host, Level, Needs, Outcome, Plugin, PluginError, export

MIB = 1 << 20


def deep(n: int) -> int:
    return 0 if n == 0 else deep(n - 1) + 1


class Fault(Plugin):
    def needs(self, config: Config) -> Needs:
        fault = config.string_or("fault", "none")
        needs = Needs()
        if fault == "kv_flood":
            needs = needs.with_kv()
        if fault == "forward_flood":
            needs = needs.with_destination(config.required_string("destination"))
        return needs

    def handle(self, event: Event, host: Host) -> Outcome:
        config = Config(host.config())
        fault = config.string_or("fault", "none")
        count = config.uint_or("count", 1000)
        if fault == "none":
            return Outcome.pass_()
        if fault == "loop":
            n = 0
            while True:
                n += 1
        if fault == "sleep":
            time.sleep(config.uint_or("secs", 3600))
            return Outcome.pass_()
        if fault == "memory":
            blocks = []
            while True:
                blocks.append(bytearray(b"\1" * MIB))
        if fault == "recursion":
            # Past Python's own limit, as a hostile plugin would set it.
            sys.setrecursionlimit(10_000_000)
            deep(10_000_000)
            return Outcome.pass_()
        if fault == "trap":
            raise RuntimeError("fault plugin: trap")
        if fault == "huge_output":
            return Outcome.replace("x" * config.uint_or("size_bytes", 8 * MIB))
        if fault == "error":
            raise PluginError(config.string_or("message", "fault plugin: error"))
        if fault == "log_flood":
            line = "l" * 1000 + "\nfake hub line"
            for _ in range(count):
                host.log(Level.ERROR, line)
            return Outcome.pass_()
        if fault == "stdout_flood":
            chunk = "o" * 1023
            for _ in range(count):
                print(chunk)
            return Outcome.pass_()
        if fault == "kv_flood":
            value = "v" * config.uint_or("size_bytes", 1024)
            for i in range(count):
                try:
                    host.kv_set(f"{event.id}-{i}", value)
                except Exception:
                    pass
            return Outcome.pass_()
        if fault == "forward_flood":
            destination = config.required_string("destination")
            outcome = Outcome.pass_()
            for _ in range(count):
                outcome = outcome.forward(destination, event.payload)
            return outcome
        raise PluginError(f'config: fault "{fault}" is not known')


WitWorld = export(Fault)
