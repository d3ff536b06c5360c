#include "engine/request.h"

namespace tokenmill {

std::vector<TokenEvent> RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !events_.empty(); });
  std::vector<TokenEvent> out(std::make_move_iterator(events_.begin()),
                              std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void RequestStream::push(TokenEvent ev) {
  ev.queued_at = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

}  // namespace tokenmill
