package main

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gatehouse-dev/gatehouse/channel/telegram"
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
