// Public API: chat templates. A model's Jinja template (GGUF tokenizer.chat_template, tokenizer_config.json) is
// recognized by its markers as one of a few common families and rendered by plain code, no Jinja engine:
//   chatml   <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen2, Qwen2.5, Qwen3; a default system prompt is taken
//            from the template)
//   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
//   llama2   <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s>
//   mistral  [INST] user [/INST]assistant</s>  (v0.1/v0.2; a system message is prefixed to the first user turn)
//   mistral-v3  [INST] user[/INST] assistant</s>  (v0.3; a system message is prefixed to the last user turn)
//   mistral-v3-tekken  [INST]user[/INST]assistant</s>  (Nemo; likewise)
//   gemma    <start_of_turn>user\ncontent<end_of_turn>\n (assistant is "model"; system opens the first turn: Gemma 3)
//   phi3     <|user|>\ncontent<|end|>\n  (Phi-3, Phi-3.5)
// The text matches what the original Jinja template renders, except that the BOS text a template writes at the very
// start (bos_token in Llama 2/3, Mistral, Gemma) is left out: the tokenizer adds BOS itself when the model asks for
// it (encode with add_special and parse_special).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (chatml and llama3 accept any role name)
  std::string content;
};

struct ChatTemplate {
  std::string name;            // one of chat_template_names()
  std::string default_system;  // system prompt the template inserts when the conversation has none ("" = none)
  std::string bos_text = "<s>";   // text of BOS / EOS where a template writes them between turns (llama2, mistral)
  std::string eos_text = "</s>";
};

// The families render_chat knows.
const std::vector<std::string>& chat_template_names();

// The family of a Jinja template, by its markers; "" when none matches.
std::string detect_template(std::string_view jinja_source);

// The template to use: `override_name` when given (Error if it is not a known name), else detected from
// `jinja_source` (Error saying the template is unknown and that --chat-template NAME overrides it).
ChatTemplate resolve_chat_template(std::string_view jinja_source, std::string_view override_name = "");
// Same, from the model's tokenizer (its template and its BOS / EOS texts).
ChatTemplate chat_template_for(const Tokenizer& tokenizer, std::string_view override_name = "");

// Renders the conversation; add_generation_prompt appends the header of the assistant's next turn.
std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt);
std::string render_chat(std::string_view name, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace tessera
