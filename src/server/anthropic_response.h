// Anthropic response writers: the whole message body, and the streamed event sequence
// message_start, (content_block_start, content_block_delta*, content_block_stop)*,
// message_delta, message_stop, with ping events as keepalives.
#pragma once

#include <string>
#include <vector>

#include "server/generation.h"

namespace tokenmill::server {

std::string anthropic_message_body(const Generation& gen);
std::string anthropic_count_tokens_body(int tokens);

class AnthropicStreamWriter {
 public:
  explicit AnthropicStreamWriter(const Generation& gen) : gen_(gen) {}
  std::string start();  // message_start (+ a first ping)
  std::string deltas(const std::vector<ChoiceDelta>& ds);
  std::string end();  // closes the open block, message_delta, message_stop
  static std::string ping() { return "event: ping\ndata: {\"type\": \"ping\"}\n\n"; }

 private:
  enum class Block { kNone, kThinking, kText, kTool };
  std::string open(Block b, const OutputEvent* tool);
  std::string close();
  const Generation& gen_;
  Block block_ = Block::kNone;
  int index_ = -1;
  std::string finish_reason_, stop_sequence_;
};

// "end_turn", "max_tokens", "stop_sequence" or "tool_use" for a choice's finish.
std::string anthropic_stop_reason(const std::string& finish_reason,
                                  const std::string& stop_sequence);

}  // namespace tokenmill::server
