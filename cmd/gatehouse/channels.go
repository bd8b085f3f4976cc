package main

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gatehouse-dev/gatehouse/channel/slack"
	"github.com/gatehouse-dev/gatehouse/channel/telegram"
	"github.com/gatehouse-dev/gatehouse/channel/webpush"
	"github.com/gatehouse-dev/gatehouse/node"
)

// channelFlags are serve's flags of the chat and push channels.
type channelFlags struct {
	responders responders
	maxSends   int

	telegramToken, telegramAPI      string
	telegramUsers                   idPeople
	telegramChats                   peopleIDs
	telegramWebhook, telegramSecret string

	slackToken, slackSecret, slackAPI string
	slackUsers                        textPeople
	slackConversations                peopleTexts

	webpush        bool
	webpushSubject string
}

func (c *channelFlags) flags(fs *flag.FlagSet, d node.Options) {
	fs.Var(&c.responders, "channel-responders", "who may answer a policy rule's prompts through chat and push channels: `rule=person[,person...]`, groups separated by ';'; repeatable. A rule not listed: its prompt's owner")
	fs.IntVar(&c.maxSends, "channel-max-sends", d.Channels.MaxSends, "calls to chat and push platforms in flight at once, in all")
	fs.StringVar(&c.telegramToken, "telegram-token", "", "Telegram bot `token` (from @BotFather); set it to turn the Telegram channel on. A secret: prefer GATEHOUSE_TELEGRAM_TOKEN")
	fs.Var(&c.telegramUsers, "telegram-users", "Telegram users and the people they are: `user_id=person[,...]`; only they may answer; repeatable")
	fs.Var(&c.telegramChats, "telegram-chats", "chats each person's prompts go to: `person=chat_id[,...]` (a group's id is negative); a mapped user with none: their private chat with the bot; repeatable")
	fs.StringVar(&c.telegramAPI, "telegram-api-url", telegram.DefaultAPIURL, "Telegram Bot API base `URL` (a local Bot API server)")
	fs.StringVar(&c.telegramWebhook, "telegram-webhook-url", "", "public `URL` of "+telegram.HookPath+" on this gateway: Telegram POSTs updates there instead of being polled (needs --telegram-webhook-secret)")
	fs.StringVar(&c.telegramSecret, "telegram-webhook-secret", "", "secret token Telegram sends with each webhook request (A-Z, a-z, 0-9, _, -; up to 256)")
	fs.StringVar(&c.slackToken, "slack-token", "", "Slack app's bot `token` (xoxb-..., scope chat:write); set it to turn the Slack channel on. A secret: prefer GATEHOUSE_SLACK_TOKEN")
	fs.StringVar(&c.slackSecret, "slack-signing-secret", "", "Slack app's signing `secret`, which signs its requests to "+slack.HookPath+". A secret: prefer GATEHOUSE_SLACK_SIGNING_SECRET")
	fs.Var(&c.slackUsers, "slack-users", "Slack users and the people they are: `user_id=person[,...]` (U...); only they may answer; repeatable")
	fs.Var(&c.slackConversations, "slack-conversations", "conversations each person's prompts are posted to: `person=channel_id[,...]` (C...); a mapped user with none: a direct message from the app; repeatable")
	fs.StringVar(&c.slackAPI, "slack-api-url", slack.DefaultAPIURL, "Slack Web API base `URL`")
	fs.BoolVar(&c.webpush, "webpush", false, "turn the Web Push channel on: the approvals app (/ui/) subscribes phones and browsers to prompt notifications; the VAPID key pair is kept in the store (an earlier release's "+webpush.KeyFile+" in --data is imported once)")
	fs.StringVar(&c.webpushSubject, "webpush-subject", "", "VAPID subject push services may contact about this gateway: a `mailto: address or https URL`")
}

// apply sets o's channel options from the flags.
func (c *channelFlags) apply(o *node.Options) error {
	o.Channels.Responders, o.Channels.MaxSends = c.responders, c.maxSends
	if c.telegramToken == "" {
		if len(c.telegramUsers) > 0 || len(c.telegramChats) > 0 || c.telegramWebhook != "" {
			return errors.New("serve: --telegram-users, --telegram-chats and --telegram-webhook-url need --telegram-token")
		}
	} else {
		if len(c.telegramUsers) == 0 {
			return errors.New("serve: --telegram-token needs --telegram-users: the Telegram users who may answer, and the people they are")
		}
		users := map[int64]string{}
		for id, person := range c.telegramUsers {
			users[id] = person
		}
		o.Telegram = &telegram.Options{Token: c.telegramToken, APIURL: c.telegramAPI, Users: users,
			Chats: c.telegramChats, WebhookURL: c.telegramWebhook, WebhookSecret: c.telegramSecret}
	}
	switch {
	case c.slackToken == "" && c.slackSecret == "":
		if len(c.slackUsers) > 0 || len(c.slackConversations) > 0 {
			return errors.New("serve: --slack-users and --slack-conversations need --slack-token and --slack-signing-secret")
		}
	case c.slackToken == "" || c.slackSecret == "":
		return errors.New("serve: the Slack channel needs both --slack-token and --slack-signing-secret")
	case len(c.slackUsers) == 0:
		return errors.New("serve: --slack-token needs --slack-users: the Slack users who may answer, and the people they are")
	default:
		o.Slack = &slack.Options{Token: c.slackToken, SigningSecret: c.slackSecret, APIURL: c.slackAPI,
			Users: c.slackUsers, Conversations: c.slackConversations}
	}
	if c.webpush {
		o.WebPush = &webpush.Options{Subject: c.webpushSubject}
	} else if c.webpushSubject != "" {
		return errors.New("serve: --webpush-subject needs --webpush")
	}
	return nil
}

// textPeople collects id=person pairs of a platform whose ids are text.
type textPeople map[string]string

func (m *textPeople) String() string {
	parts := make([]string, 0, len(*m))
	for id, p := range *m {
		parts = append(parts, id+"="+p)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *textPeople) Set(v string) error {
	for _, pair := range splitList(v) {
		id, person, ok := strings.Cut(pair, "=")
		id, person = strings.TrimSpace(id), strings.TrimSpace(person)
		if !ok || id == "" || person == "" {
			return fmt.Errorf("%q: want user_id=person", pair)
		}
		if *m == nil {
			*m = textPeople{}
		}
		(*m)[id] = person
	}
	return nil
}

// peopleTexts collects person=id pairs of a platform whose ids are text.
type peopleTexts map[string][]string

func (m *peopleTexts) String() string {
	var parts []string
	for p, ids := range *m {
		for _, id := range ids {
			parts = append(parts, p+"="+id)
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *peopleTexts) Set(v string) error {
	for _, pair := range splitList(v) {
		person, id, ok := strings.Cut(pair, "=")
		id, person = strings.TrimSpace(id), strings.TrimSpace(person)
		if !ok || id == "" || person == "" {
			return fmt.Errorf("%q: want person=conversation_id", pair)
		}
		if *m == nil {
			*m = peopleTexts{}
		}
		(*m)[person] = append((*m)[person], id)
	}
	return nil
}

// idPeople collects id=person pairs (a platform's user ids).
type idPeople map[int64]string

func (m *idPeople) String() string {
	parts := make([]string, 0, len(*m))
	for id, p := range *m {
		parts = append(parts, strconv.FormatInt(id, 10)+"="+p)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *idPeople) Set(v string) error {
	for _, pair := range splitList(v) {
		id, person, ok := strings.Cut(pair, "=")
		n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
		if !ok || err != nil || strings.TrimSpace(person) == "" {
			return fmt.Errorf("%q: want user_id=person", pair)
		}
		if *m == nil {
			*m = idPeople{}
		}
		(*m)[n] = strings.TrimSpace(person)
	}
	return nil
}

// peopleIDs collects person=id pairs (the chats a person's prompts go to).
type peopleIDs map[string][]int64

func (m *peopleIDs) String() string {
	var parts []string
	for p, ids := range *m {
		for _, id := range ids {
			parts = append(parts, p+"="+strconv.FormatInt(id, 10))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *peopleIDs) Set(v string) error {
	for _, pair := range splitList(v) {
		person, id, ok := strings.Cut(pair, "=")
		n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
		if !ok || err != nil || strings.TrimSpace(person) == "" {
			return fmt.Errorf("%q: want person=chat_id", pair)
		}
		if *m == nil {
			*m = peopleIDs{}
		}
		person = strings.TrimSpace(person)
		(*m)[person] = append((*m)[person], n)
	}
	return nil
}

// responders collects --channel-responders: rule=person,person groups,
// separated by ';' (so that one environment variable holds several),
// repeatable.
type responders map[string][]string

func (r *responders) String() string {
	parts := make([]string, 0, len(*r))
	for rule, who := range *r {
		parts = append(parts, rule+"="+strings.Join(who, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, ";")
}

func (r *responders) Set(v string) error {
	for group := range strings.SplitSeq(v, ";") {
		if group = strings.TrimSpace(group); group == "" {
			continue
		}
		rule, who, ok := strings.Cut(group, "=")
		people := splitList(who)
		if !ok || strings.TrimSpace(rule) == "" || len(people) == 0 {
			return fmt.Errorf("%q: want rule=person[,person...]", group)
		}
		if *r == nil {
			*r = responders{}
		}
		(*r)[strings.TrimSpace(rule)] = people
	}
	return nil
}
