// bin/train --gpus N (local_launch.h).
#include "dist/local_launch.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/errors.h"
#include "core/flags.h"
#include "core/handles.h"
#include "dist/socket.h"

namespace {

std::atomic<int> g_forward_signal{0};
extern "C" void on_launcher_signal(int sig) { g_forward_signal = sig; }

// The variables of the launchers this process might itself run under: the ranks it starts are not
// those launchers' processes, so they must not see them (launch_env.h would take them for a rank).
const char* const kOuterLaunchVariables[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                             "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                                             "SLURM_LOCALID"};

[[noreturn]] void exec_rank(const LocalLaunch& l, int rank) {
  for (const char* v : kOuterLaunchVariables) unsetenv(v);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(l.ranks).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(l.ranks).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(l.port).c_str(), 1);
  std::vector<char*> argv{const_cast<char*>(l.program.c_str())};
  for (const std::string& a : l.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(l.program.c_str(), argv.data());
  std::fprintf(stderr, "error: --gpus: cannot start rank %d (%s): %s\n", rank, l.program.c_str(), std::strerror(errno));
  _exit(127);
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

// Waits for every rank; the first one to fail makes the others stop. A function of its own because
// the loop, the signal forwarding and the grace period share its state; read it top to bottom.
int wait_for_ranks(std::vector<pid_t>& pids, double grace_s) {
  int first_failed = -1, failed_status = 0, running = static_cast<int>(pids.size());
  Deadline kill_at = Deadline::max();
  while (running > 0) {
    if (const int sig = g_forward_signal.exchange(0))
      for (pid_t p : pids)
        if (p > 0) kill(p, sig);
    if (SteadyClock::now() >= kill_at)
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
    bool reaped = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (pids[r] <= 0) continue;
      const pid_t w = waitpid(pids[r], &status, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR)) continue;
      if (w < 0) status = 255 << 8;  // reaped elsewhere: its end is unknown, so it counts as failed
      pids[r] = -1;
      --running;
      reaped = true;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && first_failed < 0) {
        first_failed = static_cast<int>(r);
        failed_status = status;
        for (pid_t p : pids)
          if (p > 0) kill(p, SIGTERM);
        kill_at = deadline_in(grace_s);
      }
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failed < 0) return 0;
  std::fflush(stdout);
  std::fprintf(stderr, "error: --gpus: rank %d %s first; the other ranks were stopped\n", first_failed,
               how_it_ended(failed_status).c_str());
  return exit_code_of(failed_status);
}

}  // namespace

std::vector<std::string> args_without_gpus(int argc, const char* const* argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const FlagToken t = split_flag(argv[i]);
    if (t.name != "--gpus") {
      out.emplace_back(argv[i]);
      continue;
    }
    if (!t.has_inline) ++i;  // its value
  }
  return out;
}

int free_local_port() {
  const Socket s = listen_on(0);
  return local_port(s);
}

std::string this_executable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Fatal(std::string("cannot find this program's executable (/proc/self/exe): ") + std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

void check_gpus_flag_allowed(const EnvLookup& env) {
  for (const auto& [rank, world] : {std::pair{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}}) {
    const char* w = env(world);
    if (env(rank) && w && std::atoi(w) > 1)
      throw UsageError(std::string("--gpus starts its own ranks, but a launcher already made this process rank ") +
                       env(rank) + " of " + w + " (" + rank + "): use one or the other");
  }
}

int run_local_ranks(const LocalLaunch& l) {
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < l.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGTERM);
      throw Fatal(std::string("--gpus: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) exec_rank(l, r);
    pids.push_back(pid);
  }
  const int code = wait_for_ranks(pids, l.grace_s);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return code;
}

int gpus_without_cuda(const std::string& gpus_dir, const char* visible) {
  DIR* dir = opendir(gpus_dir.c_str());
  if (!dir) return -1;
  int present = 0;
  while (const dirent* e = readdir(dir))
    if (e->d_name[0] != '.') ++present;  // one entry per GPU, named by its PCI address
  closedir(dir);
  if (present == 0) return -1;
  if (!visible) return present;
  // Counted here only where CUDA's reading is plain: distinct indices, spaces aside, taken up to the
  // first that names no device. UUIDs, MIG instances and repeats (CUDA then shows none) go to CUDA.
  std::vector<bool> seen(size_t(present), false);
  int shown = 0;
  const std::string list(visible);
  for (size_t i = 0; i <= list.size();) {
    const size_t end = std::min(list.find(',', i), list.size());
    std::string item = list.substr(i, end - i);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) return -1;
    if (item.empty() || item.size() > 3 || item.find_first_not_of("0123456789") != std::string::npos) break;
    const int index = std::stoi(item);
    if (index >= present) break;
    if (seen[size_t(index)]) return -1;
    seen[size_t(index)] = true;
    ++shown;
    i = end + 1;
  }
  return shown;
}

int launch_local_ranks(int argc, const char* const* argv, int gpus, double timeout_s) {
  const EnvLookup env = [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
  check_gpus_flag_allowed(env);
  int devices = gpus_without_cuda("/proc/driver/nvidia/gpus", env("CUDA_VISIBLE_DEVICES"));
  if (devices <= 0) {  // no driver, or nothing visible: CUDA's own words for it
    require_cuda_device();
    CUDA_CHECK(cudaGetDeviceCount(&devices));
  }
  if (devices < gpus)
    throw InputError("--gpus " + std::to_string(gpus) + ": this machine shows only " + std::to_string(devices) +
                     " CUDA device" + (devices == 1 ? "" : "s") + " (check CUDA_VISIBLE_DEVICES)");
  LocalLaunch l;
  l.program = this_executable();
  l.args = args_without_gpus(argc, argv);
  l.ranks = gpus;
  // The ranks meet on this machine; a MASTER_PORT given is kept (and checked), else any free port.
  const EnvLookup local = [&](const char* n) { return std::strcmp(n, "MASTER_ADDR") == 0 ? "127.0.0.1" : env(n); };
  l.port = env("MASTER_PORT") ? master_address(local).port : free_local_port();
  l.grace_s = timeout_s + 30;
  return run_local_ranks(l);
}
