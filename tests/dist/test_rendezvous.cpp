// The TCP rendezvous on 127.0.0.1 (dist/rendezvous.h): between threads and between two processes,
// the shared id arrives; a rank that never comes is a timeout with one line, on either side; a port
// already taken is a clear error; ranks started differently are refused with what differs.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/elapsed.h"
#include "core/errors.h"
#include "dist/rendezvous.h"
#include "dist/socket.h"

namespace {

int free_port() {
  const Socket s = listen_on(0);
  return local_port(s);
}

Fingerprint prints(const std::string& lr) {
  Fingerprint f;
  f.add("build", "train").add("--lr", lr);
  return f;
}

RendezvousConfig config(int port, int rank, int world, double timeout_s = 10, const std::string& lr = "0.02") {
  RendezvousConfig c;
  c.master = {"127.0.0.1", port};
  c.rank = rank;
  c.world = world;
  c.fingerprint = prints(lr);
  c.timeout_s = timeout_s;
  if (rank == 0) c.shared = std::string("id\0with\xff" "bytes", 13);
  return c;
}

// What a rank's rendezvous ended with: the shared payload, or the error's text.
struct Outcome {
  std::string shared, error;
  size_t peers = 0;
};

Outcome attempt(const RendezvousConfig& c) {
  Outcome o;
  try {
    RendezvousResult r = rendezvous(c);
    o.shared = r.shared;
    for (const Socket& s : r.peers) o.peers += s.valid();
  } catch (const InputError& e) {
    o.error = e.what();
  }
  return o;
}

std::future<Outcome> start(const RendezvousConfig& c) { return std::async(std::launch::async, attempt, c); }

}  // namespace

TEST(Rendezvous, EveryRankReceivesTheSharedId) {
  const int port = free_port();
  auto r1 = start(config(port, 1, 3));
  auto r2 = start(config(port, 2, 3));
  const Outcome r0 = attempt(config(port, 0, 3));
  const Outcome o1 = r1.get(), o2 = r2.get();
  const std::string id = config(port, 0, 3).shared;
  EXPECT_EQ(r0.error, "");
  EXPECT_EQ(r0.shared, id);
  EXPECT_EQ(r0.peers, 2u);  // rank 0 keeps a connection to each rank for the watch
  EXPECT_EQ(o1.shared, id) << o1.error;
  EXPECT_EQ(o2.shared, id) << o2.error;
  EXPECT_EQ(o1.peers, 1u);
}

TEST(Rendezvous, BetweenTwoProcesses) {
  const int port = free_port();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: writes what it received to the pipe
    close(pipe_fds[0]);
    const Outcome o = attempt(config(port, 1, 2));
    const std::string out = o.error.empty() ? o.shared : "error: " + o.error;
    const ssize_t n = write(pipe_fds[1], out.data(), out.size());
    _exit(n == static_cast<ssize_t>(out.size()) && o.error.empty() ? 0 : 1);
  }
  close(pipe_fds[1]);
  const Outcome r0 = attempt(config(port, 0, 2));
  std::string got;
  char buf[256];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(r0.error, "");
  EXPECT_EQ(got, config(port, 0, 2).shared);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Rendezvous, RankZeroTimesOutWhenARankNeverComes) {
  const int port = free_port();
  const auto t0 = SteadyClock::now();
  auto r1 = start(config(port, 1, 3, 5));
  const Outcome r0 = attempt(config(port, 0, 3, 0.8));
  EXPECT_LT(seconds_since(t0), 5);
  EXPECT_NE(r0.error.find("only 2 of 3 ranks arrived"), std::string::npos) << r0.error;
  EXPECT_NE(r0.error.find("missing: rank 2"), std::string::npos) << r0.error;
  const Outcome o1 = r1.get();  // told why, at once
  EXPECT_NE(o1.error.find("refused by rank 0"), std::string::npos) << o1.error;
}

TEST(Rendezvous, ARankTimesOutWhenRankZeroNeverComes) {
  const int port = free_port();
  const auto t0 = SteadyClock::now();
  const Outcome o = attempt(config(port, 1, 2, 0.6));
  EXPECT_LT(seconds_since(t0), 5);
  EXPECT_GE(seconds_since(t0), 0.5);
  EXPECT_NE(o.error.find("rank 0 did not come"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << o.error;
  EXPECT_EQ(o.error.find('\n'), std::string::npos);
}

TEST(Rendezvous, PortAlreadyTakenIsAClearError) {
  const Socket taken = listen_on(0);
  const int port = local_port(taken);
  const Outcome r0 = attempt(config(port, 0, 2, 1));
  EXPECT_NE(r0.error.find("port " + std::to_string(port) + " is already in use"), std::string::npos) << r0.error;
  EXPECT_NE(r0.error.find("MASTER_PORT"), std::string::npos) << r0.error;
}

TEST(Rendezvous, MismatchedFlagsAreRefusedOnEveryRank) {
  const int port = free_port();
  auto r1 = start(config(port, 1, 3, 10, "0.1"));
  auto r2 = start(config(port, 2, 3));
  const Outcome r0 = attempt(config(port, 0, 3));
  const Outcome o1 = r1.get(), o2 = r2.get();
  const std::string what = "--lr is '0.02' on rank 0 but '0.1' on rank 1";
  EXPECT_NE(r0.error.find(what), std::string::npos) << r0.error;
  EXPECT_NE(r0.error.find("rank 1 was started with another build or other flags"), std::string::npos) << r0.error;
  EXPECT_NE(o1.error.find("refused by rank 0"), std::string::npos) << o1.error;
  EXPECT_NE(o1.error.find(what), std::string::npos) << o1.error;
  EXPECT_NE(o2.error.find(what), std::string::npos) << o2.error;  // the innocent rank learns why too
}

TEST(Rendezvous, WorldSizeMismatchAndDuplicateRanksAreRefused) {
  int port = free_port();
  auto bad_world = start(config(port, 1, 4));
  Outcome r0 = attempt(config(port, 0, 2));
  EXPECT_NE(r0.error.find("world size of 4"), std::string::npos) << r0.error;
  EXPECT_NE(bad_world.get().error.find("refused"), std::string::npos);

  port = free_port();
  auto first = start(config(port, 1, 3));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto twice = start(config(port, 1, 3));
  r0 = attempt(config(port, 0, 3, 1.5));
  EXPECT_NE(r0.error.find("rank 1 was started twice"), std::string::npos) << r0.error;
  first.get();
  twice.get();
}

TEST(Rendezvous, AStrangerOnThePortIsIgnored) {
  const int port = free_port();
  auto stranger = std::async(std::launch::async, [port] {
    Socket s = connect_until("127.0.0.1", port, deadline_in(5));
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    if (s.valid()) (void)!write(s.fd(), junk, sizeof(junk));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  auto r1 = std::async(std::launch::async, [port] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return attempt(config(port, 1, 2));
  });
  const Outcome r0 = attempt(config(port, 0, 2));
  EXPECT_EQ(r0.error, "");
  EXPECT_EQ(r1.get().shared, config(port, 0, 2).shared);
  stranger.get();
}

TEST(Rendezvous, AnUnknownHostIsAClearError) {
  RendezvousConfig c = config(free_port(), 1, 2, 1);
  c.master.host = "no-such-host.invalid";
  const Outcome o = attempt(c);
  EXPECT_NE(o.error.find("cannot resolve MASTER_ADDR 'no-such-host.invalid'"), std::string::npos) << o.error;
}
