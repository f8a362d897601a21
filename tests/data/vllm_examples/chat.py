# vLLM's examples/offline_inference/basic/chat.py (vLLM 0.32), with its import line changed and
# its command line replaced by the values it defaults to (the model: tinyllm's bundled checkpoint).
from tinyllm import LLM, SamplingParams
from tinyllm.model.checkpoint import BUNDLED_MODEL


def main(max_tokens=16, temperature=0.0, top_p=None, top_k=None, chat_template_path=None):
    # Create a sampling params object.
    sampling_params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k

    # Create an LLM.
    llm = LLM(model=str(BUNDLED_MODEL))

    def print_outputs(outputs):
        print("\nGenerated Outputs:\n" + "-" * 80)
        for output in outputs:
            prompt = output.prompt
            generated_text = output.outputs[0].text
            print(f"Prompt: {prompt!r}\n")
            print(f"Generated text: {generated_text!r}")
            print("-" * 80)

    print("=" * 80)

    # In this script, we demonstrate how to pass input to the chat method:
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
    print_outputs(outputs)

    # You can run batch inference with llm.chat API
    conversations = [conversation for _ in range(10)]

    # We turn on tqdm progress bar to verify it's indeed running batch inference
    outputs = llm.chat(conversations, sampling_params, use_tqdm=True)
    print_outputs(outputs)

    # A chat template can be optionally supplied.
    # If not, the model will use its default chat template.
    if chat_template_path is not None:
        with open(chat_template_path) as f:
            chat_template = f.read()

        outputs = llm.chat(conversations, sampling_params, use_tqdm=False, chat_template=chat_template)
        print_outputs(outputs)


if __name__ == "__main__":
    main()
