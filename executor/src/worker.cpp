// dplan-worker: one rank of the executor, through its public header alone.
#include "dplan/executor/executor.h"

int main(int argc, char** argv) { return dplan::executor::run_worker(argc, argv); }
