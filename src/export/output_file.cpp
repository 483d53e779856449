// Output paths checked up front (export/output_file.h).
#include "export/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "core/file_io.h"

void check_output_file(const std::string& path, const std::string& flag) {
  if (path.empty()) throw InputError(flag + ": the file name is empty");
  const std::string what = flag + " " + path + ": ";
  struct stat st{};
  if (path.back() == '/' || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
    throw InputError(what + "is a directory, expected a file name");
  const std::string dir = parent_directory(path);
  if (stat(dir.c_str(), &st) != 0)
    throw InputError(what + "directory " + dir + (errno == ENOENT ? " does not exist" : ": " + std::string(std::strerror(errno))));
  if (!S_ISDIR(st.st_mode)) throw InputError(what + dir + " is not a directory");
  // Creating the temporary file is the one test that also catches read-only file systems and
  // permissions that access() cannot judge (root, ACLs).
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
  } else if (errno != EEXIST) {
    throw InputError(what + "cannot create files in " + dir + ": " + std::strerror(errno));
  } else if (::access(tmp.c_str(), W_OK) != 0) {  // a leftover of a run that was killed
    throw InputError(what + "cannot replace the leftover " + tmp + ": " + std::strerror(errno));
  }
}
