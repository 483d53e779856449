// TCP for the rendezvous and the ranks' watch over each other: an owned socket, a listener, connects
// that retry until a deadline, and length-prefixed frames. Every wait has a deadline, so nothing
// here can hang a rank; a peer that is gone is a return value, never a SIGPIPE.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

// Seconds from now as a deadline.
Deadline deadline_in(double seconds);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
};

// A listener on every interface at `port` (0: any free port). A port already taken is an InputError
// that names it and says what to do.
Socket listen_on(int port);
// The local port of a socket (what listen_on(0) got).
int local_port(const Socket& s);
// One incoming connection, or an invalid Socket when the deadline passes first.
Socket accept_until(const Socket& listener, Deadline deadline);
// A connection to host:port, retrying while nothing listens there yet; an invalid Socket when the
// deadline passes. A host that does not resolve is an InputError.
Socket connect_until(const std::string& host, int port, Deadline deadline);

// Frames: a magic number, a type and a length, then the payload.
struct Frame {
  uint32_t type = 0;
  std::string payload;
};
enum class RecvStatus { Ok, Timeout, Closed, Garbage };

// false when the peer is gone (or the deadline passed with the send buffer full).
bool send_frame(const Socket& s, uint32_t type, const std::string& payload, Deadline deadline);
// One whole frame; Closed when the peer closed or reset the connection, Garbage when what came is
// not a frame of ours.
RecvStatus recv_frame(const Socket& s, Deadline deadline, Frame* out);
