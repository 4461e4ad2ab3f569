/**
 * Model agents: {@linkcode ChatAgent} drives a run with a model over an
 * OpenAI-compatible Chat Completions endpoint ({@linkcode OpenAiBackend}:
 * OpenAI, vLLM, SGLang, llama.cpp's `llama-server`, Ollama) or the
 * Anthropic Messages API ({@linkcode AnthropicBackend}), with tools from the
 * run's capabilities ({@linkcode shellTools}; {@linkcode computerTool} for a
 * desktop) and the author's own
 * ({@linkcode defineTool}). Only `fetch`: no SDK. {@linkcode CommandAgent}
 * runs any program as the agent.
 *
 * @module
 */

export {
  AgentLimitError,
  ChatAgent,
  type ChatAgentOptions,
  trimToolResults,
} from "./chat_agent.ts";
export {
  type AnthropicToolDefinition,
  type ChatImage,
  type ChatMessage,
  isRetryable,
  type ModelBackend,
  modelCause,
  ModelHttpError,
  type ModelReply,
  ModelReplyError,
  type ModelRequest,
  ModelStreamError,
  ModelUnavailableError,
  parseRetryAfter,
  publicUrl,
  type RetryOptions,
  type SamplingOptions,
  type TokenUsage,
  type ToolCall,
  type ToolChoice,
  type ToolSpec,
  withRetries,
} from "./model.ts";
export {
  COMPUTER_ACTIONS,
  type ComputerAction,
  computerTool,
  type ComputerToolOptions,
  ImageResult,
  modelScreen,
  type ToolImage,
} from "./computer.ts";
export {
  CommandAgent,
  type CommandAgentOptions,
  type CommandAgentRecord,
  type ModelRoute,
  type ModelRouter,
} from "./command.ts";
export type { ExitStatus } from "../_internal/exit.ts";
export { OpenAiBackend, type OpenAiBackendOptions, openAiBody } from "./openai.ts";
export { AnthropicBackend, type AnthropicBackendOptions, anthropicBody } from "./anthropic.ts";
export {
  type AgentTool,
  defineTool,
  shellTools,
  type ShellToolsOptions,
  type ToolContext,
  type ToolDefinition,
  truncate,
} from "./tools.ts";
