// Package channel keeps the human channels of each principal (a person): the
// phone app, chat bot or browser tab through which they answer an agent's
// permission prompts.
//
// A channel is identified by a channel id and a native peer id (for example
// a chat platform's user id) and is registered durably under its owner. Once
// registered it is a consumer of the peer hub with the key Key(channelID,
// peerID): every prompt of its owner is appended to its outbox whether it is
// online or not, so a phone that was asleep when the prompt was raised gets
// it on reconnect, in order, also after a gateway restart. The Registry
// implements bridge.Notifier and records the channel.* events of the Agent
// Runtime spec (seed 001) in a per-owner log, read with Events.
//
// Deliveries are at least once: a consumer dedupes prompts by action_id.
//
// # Adapters
//
// The chat and push channels the gateway drives itself (Telegram, Slack and
// Web Push, in the packages of those names below this one) are Adapters.
// Each of their destinations is a registration of kind KindAdapter, whose
// outbox a driver carries through the adapter: the prompts' cards shown,
// edited once settled, retried with back-off within bounds (MaxSends,
// SendTimeout, MaxAttempts). Answers come back through Answer (a button's
// signed value) or AnswerToken (a notification's one-time token); Start
// wires the Decider that settles them. docs/channels.md describes them to
// operators.
//
// # Webhook channels
//
// A principal may configure one outbound webhook (SetWebhook), for a chat
// bot. The gateway POSTs each delivery of that channel's outbox to the URL,
// one at a time and in order, and retries the same delivery with jittered
// exponential backoff until the bot answers 2xx. Nothing is dropped: an
// unacknowledged delivery is POSTed again after a restart, so bots dedupe by
// action.action_id (or by X-Gatehouse-Delivery). The bot answers a prompt
// through POST /v0/actions/{action_id}/respond.
//
// The request body is JSON:
//
//	{
//	  "type": "permission.requested",   // or "permission.resolved" (retract the prompt)
//	  "delivery": 7,                     // the delivery's sequence in this webhook's outbox
//	  "owner": "alice",                  // the principal the prompt is for
//	  "action": { ... }                  // the action record: action_id, session_id,
//	                                     // execution_id, tool_id, arguments, state, ...
//	}
//
// with these headers:
//
//	Content-Type: application/json
//	X-Gatehouse-Event: permission.requested
//	X-Gatehouse-Delivery: 7
//	X-Gatehouse-Timestamp: 1767225600                (unix seconds of this attempt)
//	X-Gatehouse-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>
//
// To verify a request, compute HMAC-SHA256 keyed with the webhook secret over
// the timestamp header, a dot and the raw body bytes, hex-encode it and
// compare it in constant time with the value after "v1=". Reject requests
// whose timestamp is more than a few minutes from your clock, so a captured
// request cannot be replayed later. Each retry is signed afresh with its own
// timestamp. Go programs can call Verify.
package channel
