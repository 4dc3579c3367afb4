// Package redisconn turns walcount's Redis URL into a go-redis client, for
// every part of walcount that talks to Redis: the daemon, walcount check,
// status and teardown, the demo and the benchmark.
//
// One URL names any of three topologies:
//
//	redis://[user:pass@]host:port[/db]            a single node
//	rediss://…                                    the same over TLS
//	unix://[user:pass@]/path/to/redis.sock[?db=N] a single node on a socket
//	redis+cluster://[user:pass@]h1:p1,h2:p2,…     a Redis Cluster (seed nodes)
//	rediss+cluster://…                            the same over TLS
//	redis+sentinel://[user:pass@]s1:p1,s2:p2,…/<master>[/db]
//	rediss+sentinel://…                           a Sentinel-watched primary
//
// The user info is always the data nodes' credentials; the sentinels' own
// credentials are the query parameters sentinel_username and
// sentinel_password. TLS settings are query parameters too (ca_file,
// cert_file, key_file, server_name, insecure_skip_verify) or come from
// walcount's configuration file. The remaining query parameters are
// go-redis's own tuning options (dial_timeout, read_timeout, pool_size, …).
//
// Parse never returns an error that repeats a password, and Options prints
// itself redacted.
//
// New builds go-redis's own clients: a Client, a ClusterClient or a
// FailoverClient. A ClusterClient reloads its slot map every second and
// right after a connection error, so that a failed-over master is found in
// about the time the cluster takes to promote its replica. go-redis's own
// log lines go to zap, at most one warning per outage (see LogInterval).
package redisconn
