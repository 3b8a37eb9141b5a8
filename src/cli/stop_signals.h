#pragma once

// The daemons (`agent`, `server`, `dev`) stop on SIGINT and SIGTERM, read synchronously.

#include <signal.h>

namespace gpufleet::cli {

// Blocks SIGINT and SIGTERM in this thread and every thread started after, so they are read
// with sigwait/sigtimedwait instead of killing the process, and ignores SIGPIPE: a client that
// hangs up must not kill a daemon (the shim restores it for workloads). Call before starting
// any thread.
sigset_t BlockStopSignals();

}  // namespace gpufleet::cli
