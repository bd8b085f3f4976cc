package seglog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The same figures as bench_test.go, for an embedded JetStream file store
// as the local engine: a server in this process, JetStream in a temporary
// folder, reached through an in-process connection (no socket), one
// subject per stream in one stream. Appends publish and wait for the ack;
// under SyncAlways (the server's sync_interval: always) the store syncs
// each message before it acks. A replay reads one subject from its start
// through an ordered consumer.

// runJetStream starts an embedded server with JetStream in a temporary
// folder and returns a JetStream context over an in-process connection
// and a stream "LOGS" on subjects log.>.
func runJetStream(b *testing.B, syncAlways bool) jetstream.JetStream {
	b.Helper()
	s, err := server.NewServer(&server.Options{
		JetStream:  true,
		StoreDir:   b.TempDir(),
		DontListen: true,
		NoLog:      true,
		NoSigs:     true,
		SyncAlways: syncAlways,
	})
	if err != nil {
		b.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		b.Fatal("jetstream: server not ready")
	}
	b.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "LOGS", Subjects: []string{"log.>"}, Storage: jetstream.FileStorage, AllowDirect: true,
	}); err != nil {
		b.Fatal(err)
	}
	return js
}

func BenchmarkJetStreamAppend(b *testing.B) {
	payload := make([]byte, benchEntry)
	for _, n := range appenders {
		b.Run(fmt.Sprint("appenders=", n), func(b *testing.B) {
			js := runJetStream(b, true)
			runAppenders(b, n, func(w int, _ uint64) error {
				_, err := js.Publish(context.Background(), fmt.Sprint("log.w", w), payload)
				return err
			})
		})
	}
}

func BenchmarkJetStreamReplay(b *testing.B) {
	for _, tc := range []struct {
		name   string
		others int
	}{{"alone", 0}, {"interleaved=7", 7}} {
		b.Run(tc.name, func(b *testing.B) {
			// Filling is not what is measured: without a sync per message.
			js := runJetStream(b, false)
			payload := make([]byte, replayEntry)
			settle := func() {
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(time.Minute):
					b.Fatal("jetstream: publishes not acknowledged")
				}
			}
			for seq := 1; seq <= replayEvents; seq++ {
				if seq%512 == 0 {
					settle() // the client bounds the publishes awaiting acks
				}
				if _, err := js.PublishAsync("log.replay", payload); err != nil {
					b.Fatal(err)
				}
				for o := range tc.others {
					if _, err := js.PublishAsync(fmt.Sprint("log.other", o), payload); err != nil {
						b.Fatal(err)
					}
				}
			}
			settle()
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			events := 0
			for range b.N {
				c, err := js.OrderedConsumer(ctx, "LOGS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"log.replay"}})
				if err != nil {
					b.Fatal(err)
				}
				it, err := c.Messages(jetstream.PullMaxMessages(replayPage))
				if err != nil {
					b.Fatal(err)
				}
				for range replayEvents {
					if _, err := it.Next(); err != nil {
						b.Fatal(err)
					}
					events++
				}
				it.Stop()
			}
			b.StopTimer()
			b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
		})
	}
}
