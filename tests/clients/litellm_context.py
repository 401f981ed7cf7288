"""Run by test_context.py with target/litellm-venv's Python (litellm pins its own openai):
`python litellm_context.py BASE_URL MODEL`. A prompt longer than the model's context,
through litellm's OpenAI-compatible provider, must raise litellm's
ContextWindowExceededError (which its routers answer by falling back to a model with a
larger context). Prints the exception's class and message; exits 0 only on that class.
"""

import sys

import litellm


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    try:
        litellm.completion(model=f"openai/{model}", api_base=base + "/v1", api_key="unused",
                           messages=[{"role": "user", "content": "word " * 9000}], max_tokens=4, num_retries=0)
    except litellm.ContextWindowExceededError as e:
        print(f"ContextWindowExceededError: {e}")
        return 0
    except Exception as e:  # noqa: BLE001 - any other class is the failure being tested
        print(f"{type(e).__name__}: {e}")
        return 1
    print("no error: the prompt was accepted")
    return 1


if __name__ == "__main__":
    sys.exit(main())
