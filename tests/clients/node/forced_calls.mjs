// openai-node against strata serve: a forced tool call by a plain
// `chat.completions.create` at max_tokens 24, 48 and 96, and by
// `chat.completions.runTools` (a named tool choice) at 48 and 96. Run by
// tests/clients/test_tool_limits.py as `node forced_calls.mjs BASE_URL MODEL`; prints one
// JSON line per case and exits non-zero on the first failure.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused", maxRetries: 0, timeout: 300_000 });
const parameters = {
  type: "object",
  properties: { city: { type: "string", maxLength: 40 } },
  required: ["city"],
};
const weather = { type: "function", function: { name: "get_weather", description: "Get the current weather in a city.", parameters } };
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

for (const max_tokens of [24, 48, 96]) {
  const r = await client.chat.completions.create({
    model, messages, tools: [weather], tool_choice: "required", temperature: 0, max_tokens,
  });
  const choice = r.choices[0];
  const calls = choice.message.tool_calls ?? [];
  // Greedy SmolLM2 writes one call in about 30 tokens and ends: 24 cut it (`length`,
  // no call), 48 and 96 do not. The wrapper text is never the content.
  assert.ok(!choice.message.content, `content: ${choice.message.content}`);
  if (max_tokens > 24) assert.ok(choice.finish_reason === "tool_calls" && calls.length === 1, JSON.stringify(choice));
  else assert.ok(["length", "tool_calls"].includes(choice.finish_reason), JSON.stringify(choice));
  for (const c of calls) assert.equal(typeof JSON.parse(c.function.arguments).city, "string");
  console.log(JSON.stringify({ case: "create", max_tokens, finish: choice.finish_reason, calls: calls.length }));
  if (max_tokens === 24) continue; // runTools refuses any `length` finish (LengthFinishReasonError)

  let called = 0;
  const runner = client.chat.completions.runTools({
    model, messages, temperature: 0, max_tokens,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    tools: [{ type: "function", function: { ...weather.function, parse: JSON.parse, function: (args) => { called += 1; return { city: args.city, celsius: 18 }; } } }],
  });
  const call = await runner.finalFunctionToolCall();
  assert.equal(call?.name, "get_weather");
  assert.equal(called, 1, "a named tool choice is called once");
  console.log(JSON.stringify({ case: "runTools", max_tokens, result: await runner.finalFunctionToolCallResult() }));
}
