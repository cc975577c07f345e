#include "io/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mxmoe::io {

std::string ErrnoMessage(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return strerror_r(err, buf, sizeof(buf));
#else
  if (strerror_r(err, buf, sizeof(buf)) != 0) return "errno " + std::to_string(err);
  return buf;
#endif
}

Status ReadFileToString(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(path + ": cannot open: " + ErrnoMessage(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Io(path + ": not a regular file");
  }
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::Io(path + ": read failed: " + ErrnoMessage(err));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  *out = std::move(data);
  return Status::Ok();
}

namespace {

Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Io(path + ": write failed: " + ErrnoMessage(errno));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

Status AtomicWriteFile(const std::string& path, const std::vector<std::string_view>& chunks) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return Status::Io(path + ": cannot create a temporary file beside it: " + ErrnoMessage(errno));
  Status st;
  for (std::string_view c : chunks) {
    st = WriteAll(fd, c, path);
    if (!st.ok()) break;
  }
  // mkstemp creates 0600; outputs are ordinary shareable files.
  if (st.ok() && ::fchmod(fd, 0644) != 0) st = Status::Io(path + ": chmod failed: " + ErrnoMessage(errno));
  if (st.ok() && ::fsync(fd) != 0) st = Status::Io(path + ": fsync failed: " + ErrnoMessage(errno));
  if (::close(fd) != 0 && st.ok()) st = Status::Io(path + ": close failed: " + ErrnoMessage(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = Status::Io(path + ": rename from " + tmp + " failed: " + ErrnoMessage(errno));
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace mxmoe::io
