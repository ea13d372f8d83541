// The Vercel AI SDK as a gateway client, for tests/e2e/test_ai_sdk.py: `node ai_sdk_client.mjs CONFIG_JSON`
// (baseURL, apiKey, model, scenario) prints one JSON line: what the SDK returned, and every request body it
// sent (recorded by the provider's `fetch` option, which then sends it unchanged).
import { generateText, stepCountIs, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";

const cfg = JSON.parse(process.argv[2]);
const sent = [];
const provider = createOpenAI({
  baseURL: cfg.baseURL,
  apiKey: cfg.apiKey,
  fetch: async (url, init) => {
    sent.push({ url: String(url), body: init?.body ? JSON.parse(init.body) : null });
    return fetch(url, init);
  },
});
const model = provider(cfg.model); // the provider's default model: the Responses API, `store` on

// three turns, each answer's messages (output items with their ids) kept in the history, as a chat app does
async function conversation() {
  const messages = [];
  const turns = [];
  for (const text of ["Hello", "Tell me more", "And then?"]) {
    messages.push({ role: "user", content: text });
    const r = await generateText({ model, messages, maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
    messages.push(...r.response.messages);
    turns.push({ text: r.text, finishReason: r.finishReason, inputTokens: r.usage.inputTokens, id: r.response.id });
  }
  return turns;
}

// a tool loop of two steps, streamed: the model reasons and calls the tool, the SDK runs it and asks again
async function toolLoop() {
  const calls = [];
  let failure = null;
  const r = streamText({
    model,
    prompt: "Weather in Paris?",
    maxRetries: 0,
    stopWhen: stepCountIs(2),
    onError: ({ error }) => {
      failure = String(error?.message ?? error);
    },
    tools: {
      get_weather: tool({
        description: "The weather in a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          calls.push(city);
          return `18C and sunny in ${city}`;
        },
      }),
    },
  });
  const text = await r.text;
  const steps = await r.steps;
  return {
    text,
    calls,
    failure,
    steps: steps.map((s) => ({
      finishReason: s.finishReason,
      reasoning: s.reasoningText ?? null,
      toolCalls: s.toolCalls.map((c) => c.toolName),
      text: s.text,
    })),
  };
}

const result = cfg.scenario === "conversation" ? await conversation() : await toolLoop();
console.log(JSON.stringify({ result, sent }));
