package main

import (
	"fmt"
	"net/url"

	"go.etcd.io/etcd/server/v3/embed"
)

func setURLs(cfg *embed.Config, client, peer string) error {
	c, err := url.Parse(client)
	if err != nil {
		return fmt.Errorf("--listen-client-urls: %w", err)
	}
	p, err := url.Parse(peer)
	if err != nil {
		return fmt.Errorf("--listen-peer-urls: %w", err)
	}
	cfg.ListenClientUrls = []url.URL{*c}
	cfg.AdvertiseClientUrls = []url.URL{*c}
	cfg.ListenPeerUrls = []url.URL{*p}
	cfg.AdvertisePeerUrls = []url.URL{*p}
	cfg.InitialCluster = cfg.Name + "=" + p.String()
	return nil
}
