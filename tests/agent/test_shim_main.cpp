// The shim as its own small program, for the executor tests (the agent runs it as the hidden
// `gpufleet agent-shim` command instead).

#include "agent/shim.h"

int main(int argc, char** argv) {
  return gpufleet::agent::RunShim(argc, argv);
}
