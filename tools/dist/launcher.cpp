#include "launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace mxmoe::dist {

namespace {

constexpr int kStopGraceSeconds = 10;

struct Child {
  pid_t pid = -1;
  int rank = 0;
  int id_fd = -1;  // the write end of the rank's id pipe
  bool done = false;
};

// Ours to set: a variable inherited from an enclosing run would name the wrong rank.
bool IsLauncherVariable(const char* kv) {
  return std::strncmp(kv, "MXMOE_DIST_", 11) == 0 || std::strncmp(kv, "NCCL_NVLS_ENABLE=", 17) == 0;
}

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

void Signal(std::vector<Child>& children, int sig) {
  for (const Child& c : children)
    if (!c.done) kill(c.pid, sig);
}

// Reaps every child. The first failure decides the status; the others are then stopped.
int WaitForRanks(std::vector<Child>& children) {
  using Clock = std::chrono::steady_clock;
  int status = 0;
  size_t remaining = children.size();
  bool stopping = false, killed = false;
  Clock::time_point deadline;
  while (remaining > 0) {
    int st = 0;
    const pid_t pid = waitpid(-1, &st, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      std::perror("mxmoe-dist: waitpid");
      return status != 0 ? status : 2;
    }
    if (pid == 0) {
      if (!killed && Clock::now() >= deadline) {
        Signal(children, SIGKILL);
        killed = true;
      }
      usleep(50 * 1000);
      continue;
    }
    Child* child = nullptr;
    for (Child& c : children)
      if (c.pid == pid) child = &c;
    if (child == nullptr || child->done) continue;
    child->done = true;
    --remaining;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    if (stopping) continue;  // stopped by us, or failing after the first failure: that one's message stands
    if (WIFEXITED(st)) {
      status = WEXITSTATUS(st);
      std::fprintf(stderr, "mxmoe-dist: rank %d exited with status %d", child->rank, status);
    } else {
      status = 2;
      std::fprintf(stderr, "mxmoe-dist: rank %d was killed by signal %d (%s)", child->rank, WTERMSIG(st),
                   strsignal(WTERMSIG(st)));
    }
    std::fprintf(stderr, remaining > 0 ? "; stopping the other ranks\n" : "\n");
    stopping = true;
    deadline = Clock::now() + std::chrono::seconds(kStopGraceSeconds);
    Signal(children, SIGTERM);
  }
  return status;
}

}  // namespace

int LaunchRanks(const DistOptions& opts, char** argv) {
  // A rank that died before reading its id must not take the launcher down with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) {
    std::perror("mxmoe-dist: readlink /proc/self/exe");
    return 2;
  }
  exe[len] = '\0';

  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e)
    if (!IsLauncherVariable(*e)) base_env.emplace_back(*e);
  // The machines' rule: no NVLink multicast (NVLS) in any communicator.
  base_env.emplace_back("NCCL_NVLS_ENABLE=0");

  // The ranks are started first and wait on their pipes: the id is made afterwards, so that its
  // bootstrap root (a thread of this process, NCCL src/bootstrap.cc) exists only while they run.
  const pid_t launcher = getpid();
  std::vector<Child> children;
  for (int r = 0; r < opts.nproc; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("mxmoe-dist: pipe2");
      for (Child& c : children) close(c.id_fd);
      WaitForRanks(children);
      return 2;
    }
    std::vector<std::string> env = base_env;
    env.push_back("MXMOE_DIST_RANK=" + std::to_string(r));
    env.push_back("MXMOE_DIST_WORLD=" + std::to_string(opts.nproc));
    env.push_back("MXMOE_DIST_LOCAL_RANK=" + std::to_string(r));
    env.push_back("MXMOE_DIST_ID_FD=" + std::to_string(fds[0]));
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec: the CUDA driver may have started threads here.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(2);  // the launcher died before prctl took effect
      fcntl(fds[0], F_SETFD, 0);            // the rank's end of the pipe survives exec
      execve(exe, argv, envp.data());
      static const char kMsg[] = "mxmoe-dist: exec of a rank failed\n";
      (void)!write(2, kMsg, sizeof(kMsg) - 1);
      _exit(2);
    }
    close(fds[0]);
    if (pid < 0) {
      std::perror("mxmoe-dist: fork");
      close(fds[1]);
      for (Child& c : children) close(c.id_fd);  // the started ranks read EOF and stop
      WaitForRanks(children);
      return 2;
    }
    children.push_back({pid, r, fds[1], false});
  }

  ncclUniqueId id;
  const ncclResult_t nr = ncclGetUniqueId(&id);
  if (nr != ncclSuccess)
    std::fprintf(stderr, "mxmoe-dist: ncclGetUniqueId: %s (%s)\n", ncclGetErrorString(nr), ncclGetLastError(nullptr));
  for (Child& c : children) {
    // Without an id (or when a rank is already gone) the pipe just closes: the rank reads EOF
    // and stops, or its own exit status tells why it went.
    if (nr == ncclSuccess) (void)WriteAll(c.id_fd, &id, sizeof(id));
    close(c.id_fd);
  }
  const int status = WaitForRanks(children);
  return nr != ncclSuccess && status == 0 ? 2 : status;
}

Status ReadUniqueIdFromLauncher(int fd, ncclUniqueId* out) {
  char* p = reinterpret_cast<char*>(out);
  size_t got = 0;
  while (got < sizeof(*out)) {
    const ssize_t n = read(fd, p + got, sizeof(*out) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return Status::Internal("the launcher closed the NCCL id pipe (fd " + std::to_string(fd) + ") after " +
                              std::to_string(got) + " of " + std::to_string(sizeof(*out)) +
                              " bytes: it failed before the ranks could connect");
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  return Status::Ok();
}

}  // namespace mxmoe::dist
