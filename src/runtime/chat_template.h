// Chat template internals (the public API is include/tessera/chat.h).
#pragma once

#include <string>
#include <string_view>

namespace tessera::chat {

// The system prompt a ChatML template writes when the conversation starts without one (SmolLM2: "You are a
// helpful AI assistant named SmolLM, ..."), read from the literal `<|im_start|>system\n...<|im_end|>` block in the
// Jinja source; "" when the template has none or builds it from variables.
std::string chatml_default_system(std::string_view jinja_source);

// Jinja's `trim` / Python's str.strip() for the ASCII whitespace Python strips.
std::string_view trim(std::string_view s);

}  // namespace tessera::chat
