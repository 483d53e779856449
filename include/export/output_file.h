// Output paths checked before any work: a typo in a directory should cost a second, not a run.
// (The files themselves are written under a temporary name and renamed when complete: AtomicFile
// and write_file_atomic in core/file_io.h.)
#pragma once

#include <string>

// InputError "<flag> <path>: ..." unless `path` can be created or replaced: its directory exists
// and takes new files, and path is not a directory. Creates and removes path.tmp to be sure.
void check_output_file(const std::string& path, const std::string& flag);
