#!/bin/bash
# The workload behind docs/vllm-kv-events.txt: requests from another client (curl) to a vLLM server
# at ${VLLM_URL:-http://127.0.0.1:8011} while tinyllm-tui --attach ... --kv-events ... watches. A
# four-line speech continued three ways (a shared prefix, a fork), then four 400-token requests at
# once (two with the same prompt) that overflow a 64-block pool of 32-token blocks (evictions).
URL=${VLLM_URL:-http://127.0.0.1:8011}
req() { curl -s "$URL/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\":\"shakespeare\",\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0.8,\"ignore_eos\":true}" > /dev/null; }
C="KING RICHARD III:\nNow is the winter of our discontent made glorious summer by this sun of York;\nAnd all the clouds that lour'd upon our house in the deep bosom of the ocean buried.\nNow are our brows bound with victorious wreaths; our bruised arms hung up for monuments.\n"
R="ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun.\nArise, fair sun, and kill the envious moon.\n"
req "${C}GLOUCESTER:" 100
req "${C}CLARENCE:" 100 & req "${C}BRAKENBURY:" 100 & wait
sleep 2
req "$R" 400 & req "$R" 400 & req "HAMLET:\nTo be, or not to be, that is the question.\n" 400 &
req "OTHELLO:\nHer father loved me, oft invited me.\n" 400 & wait
