#!/usr/bin/env bash
# Drives `tessera chat` on a real terminal (tmux) the way a person does, and checks what issue 26 asked for: the arrow
# keys edit a line, the up arrow recalls history, Ctrl-C in the middle of a reply stops the reply and returns to the
# prompt (the process lives on), and chatting goes on past a full context.
# Usage: tests/tools/chat_tmux_check.sh [TESSERA_BINARY] [MODEL]   (exit 0 when every check passes)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/build/bin/tessera}
model=${2:-${TESSERA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
command -v tmux >/dev/null || { echo "chat_tmux_check: tmux is not installed" >&2; exit 2; }
session=tessera_chat_check_$$
pane="$session:0.0"
log=$(mktemp)
trap 'tmux kill-session -t "$session" 2>/dev/null || true; rm -f "$log"' EXIT
fails=0
ok() { echo "ok    $1"; }
bad() { echo "FAIL  $1" >&2; fails=$((fails + 1)); }
screen() { tmux capture-pane -p -J -S -200 -t "$pane"; }
# Waits until the screen matches the regex $1 (grep -E), at most $2 seconds.
wait_for() {
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    screen | grep -Eq -- "$1" && return 0
    sleep 0.2
  done
  return 1
}
# Number of prompts on the screen: a reply is finished when the count goes up.
prompts() { screen | grep -c '^> ' || true; }
wait_prompts() {
  local want=$1 deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(prompts)" -ge "$want" ] && return 0
    sleep 0.2
  done
  return 1
}

# A small context (-c 160) so that a few replies fill it; -n 120 makes a reply long enough to interrupt.
tmux new-session -d -s "$session" -x 220 -y 50 \
  "$bin chat -m '$model' -c 160 -n 120 --temp 0 -t 2 2>&1; echo TESSERA-EXITED-\$?; sleep 30"
wait_for '^> ' 60 || { screen; echo "chat did not start" >&2; exit 1; }

# 1. Line editing: type with a typo, move left with the arrow keys, insert the missing letter.
tmux send-keys -t "$pane" -l 'What is the capital of Frnce?'
tmux send-keys -t "$pane" Left Left Left Left
tmux send-keys -t "$pane" -l 'a'
wait_for '^> What is the capital of France\?' 5 && ok "arrow keys edit the line" || bad "arrow keys edit the line"
screen | grep -q '\^\[\[D' && bad "arrow keys arrive as ^[[D"
tmux send-keys -t "$pane" Enter
wait_prompts 2 60 || bad "a reply to the first message"

# 2. History: the up arrow brings the last message back.
tmux send-keys -t "$pane" Up
sleep 0.5
if screen | sed '/^[[:space:]]*$/d' | tail -n 1 | grep -q '^> What is the capital of France?$'; then ok "up arrow recalls history"; else bad "up arrow recalls history"; fi
tmux send-keys -t "$pane" C-u  # libedit (emacs keys): kill the whole line
sleep 0.2

# 3. Ctrl-C in the middle of a reply: the reply stops, the prompt comes back, the process lives.
tmux send-keys -t "$pane" -l 'Write a long story about a dragon who loves to read books.'
tmux send-keys -t "$pane" Enter
before=$(screen | wc -c)
deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ] && [ "$(screen | wc -c)" -le $((before + 40)) ]; do sleep 0.05; done
tmux send-keys -t "$pane" C-c
if wait_for '\(stopped\)' 10 && wait_prompts 3 10; then ok "Ctrl-C stops the reply and returns to the prompt"; else bad "Ctrl-C stops the reply"; fi
screen | grep -q 'TESSERA-EXITED' && bad "Ctrl-C ended the process"

# 4. Past a full context: more messages, each answered; the oldest turns are dropped.
n=$(prompts)
for msg in 'Tell me about Paris.' 'And about Rome?' 'And Berlin?' 'And Madrid?'; do
  tmux send-keys -t "$pane" -l "$msg"
  tmux send-keys -t "$pane" Enter
  n=$((n + 1))
  wait_prompts $n 90 || { bad "a reply to '$msg'"; break; }
done
if screen | grep -q 'dropped the'; then ok "chatting goes on past a full context (oldest turns dropped)"; else bad "no turn was dropped"; fi
screen | grep -q 'TESSERA-EXITED' && bad "the process ended"

# 5. Ctrl-C at the prompt discards the line; /quit leaves with status 0.
tmux send-keys -t "$pane" -l 'half a line'
tmux send-keys -t "$pane" C-c
sleep 0.5
screen | grep -q 'TESSERA-EXITED' && bad "Ctrl-C at the prompt ended the process"
tmux send-keys -t "$pane" -l '/quit'
tmux send-keys -t "$pane" Enter
wait_for 'TESSERA-EXITED-0' 10 && ok "/quit leaves with status 0" || bad "/quit leaves with status 0"
screen > "$log"
if [ $fails -gt 0 ]; then
  echo "--- screen ---" >&2
  cat "$log" >&2
  exit 1
fi
echo "chat_tmux_check: all checks passed"
