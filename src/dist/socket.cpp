// TCP sockets with deadlines and frames (socket.h). Sockets are non-blocking; every wait is a poll()
// bounded by its deadline.
#include "dist/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/errors.h"

namespace {

constexpr uint32_t kMagic = 0x52443530;   // "RD50": a frame of this trainer
constexpr uint32_t kMaxPayload = 1 << 20;  // fingerprints and ids are far smaller

std::string errno_text() { return std::strerror(errno); }

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw Fatal("fcntl(O_NONBLOCK): " + errno_text());
}

// Milliseconds left until the deadline, for poll(); 0 once it has passed.
int ms_left(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd; false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) throw Fatal("poll: " + errno_text());
  }
}

// Tries one connect; an open socket, or -1 with errno set.
int try_connect(const addrinfo* ai, Deadline deadline) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) throw Fatal("socket: " + errno_text());
  set_nonblocking(fd);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline)) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) return fd;
    errno = err;
  } else if (errno == EINPROGRESS) {
    errno = ETIMEDOUT;
  }
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return -1;
}

bool send_all(int fd, const char* data, size_t n, Deadline deadline) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

RecvStatus recv_all(int fd, char* data, size_t n, Deadline deadline) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r > 0) {
      data += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return RecvStatus::Closed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return RecvStatus::Timeout;
    } else {
      return RecvStatus::Closed;  // reset by the peer
    }
  }
  return RecvStatus::Ok;
}

}  // namespace

Deadline deadline_in(double seconds) {
  return SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket listen_on(int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) throw Fatal("socket: " + errno_text());
  const int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // a previous run's TIME_WAIT is no obstacle
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EADDRINUSE)
      throw InputError("port " + std::to_string(port) + " is already in use on this machine (another run or program "
                       "holds it): set MASTER_PORT to a free port");
    throw InputError("cannot listen on port " + std::to_string(port) + ": " + errno_text());
  }
  if (::listen(s.fd(), 128) != 0) throw InputError("cannot listen on port " + std::to_string(port) + ": " + errno_text());
  set_nonblocking(s.fd());
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw Fatal("getsockname: " + errno_text());
  return ntohs(addr.sin_port);
}

Socket accept_until(const Socket& listener, Deadline deadline) {
  for (;;) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw Fatal("accept: " + errno_text());
    if (!wait_for(listener.fd(), POLLIN, deadline)) return Socket();
  }
}

Socket connect_until(const std::string& host, int port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw InputError("cannot resolve MASTER_ADDR '" + host + "': " + gai_strerror(rc));
  for (;;) {
    const int fd = try_connect(found, deadline);
    if (fd >= 0) {
      freeaddrinfo(found);
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd);
    }
    // Refused, unreachable or timed out: rank 0 (or its machine) may not be up yet; try again.
    if (SteadyClock::now() + std::chrono::milliseconds(100) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  freeaddrinfo(found);
  return Socket();
}

bool send_frame(const Socket& s, uint32_t type, const std::string& payload, Deadline deadline) {
  const uint32_t header[3] = {htonl(kMagic), htonl(type), htonl(static_cast<uint32_t>(payload.size()))};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes += payload;
  return send_all(s.fd(), bytes.data(), bytes.size(), deadline);
}

RecvStatus recv_frame(const Socket& s, Deadline deadline, Frame* out) {
  uint32_t header[3];
  RecvStatus st = recv_all(s.fd(), reinterpret_cast<char*>(header), sizeof(header), deadline);
  if (st != RecvStatus::Ok) return st;
  const uint32_t length = ntohl(header[2]);
  if (ntohl(header[0]) != kMagic || length > kMaxPayload) return RecvStatus::Garbage;
  out->type = ntohl(header[1]);
  out->payload.assign(length, '\0');
  st = recv_all(s.fd(), out->payload.data(), length, deadline);
  return st == RecvStatus::Timeout ? RecvStatus::Garbage : st;  // half a frame is not one of ours
}
