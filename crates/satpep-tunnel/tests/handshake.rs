//! The tunnel's handshake against an attacker on the path, on loopback with the real QUIC and
//! TLS stack: a recorded handshake replayed to the gateway opens nothing, and a peer without
//! a certificate is refused.

use satpep_tunnel::admission::Admission;
use satpep_tunnel::authority::DEFAULT_DAYS;
use satpep_tunnel::congestion::stop::StopSwitch;
use satpep_tunnel::congestion::Algorithm;
use satpep_tunnel::keys::{keygen, Credentials};
use satpep_tunnel::transport::{client_config, server_config, Hop};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;

fn hop() -> Hop {
    Hop {
        send_rate: Some(10_000_000),
        receive_rate: Some(10_000_000),
        rtt: Duration::from_millis(20),
        outage: Duration::from_secs(10),
        congestion: Algorithm::Cubic,
        max_flows: 100,
    }
}

fn keys(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("satpep-hs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    keygen(
        &dir,
        &["terminal".into(), "gateway".into()],
        DEFAULT_DAYS,
        true,
    )
    .unwrap();
    dir
}

fn creds(dir: &std::path::Path, who: &str) -> Credentials {
    Credentials::load(
        &dir.join("ca.pem"),
        &dir.join(format!("{who}.pem")),
        &dir.join(format!("{who}.key")),
    )
    .unwrap()
}

fn gateway(dir: &std::path::Path) -> quinn::Endpoint {
    let sw = StopSwitch::default();
    let admit_all = Arc::new(Admission::default());
    let sc = server_config(
        creds(dir, "gateway").server_tls(&admit_all).unwrap(),
        &hop(),
        &sw,
    )
    .unwrap();
    quinn::Endpoint::server(sc, "127.0.0.1:0".parse().unwrap()).unwrap()
}

/// Forwards datagrams between a client (whoever writes first) and `server`, recording what the
/// client sends. Returns the address to connect to.
async fn tap(server: SocketAddr, log: Arc<Mutex<Vec<Vec<u8>>>>) -> SocketAddr {
    let s = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = s.local_addr().unwrap();
    tokio::spawn(async move {
        let mut client: Option<SocketAddr> = None;
        let mut buf = vec![0u8; 65536];
        loop {
            let Ok((n, from)) = s.recv_from(&mut buf).await else {
                return;
            };
            if from == server {
                if let Some(c) = client {
                    let _ = s.send_to(&buf[..n], c).await;
                }
            } else {
                client = Some(from);
                log.lock().unwrap().push(buf[..n].to_vec());
                let _ = s.send_to(&buf[..n], server).await;
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_replayed_handshake_opens_nothing() {
    let dir = keys("replay");
    let gw = gateway(&dir);
    let gw_addr = gw.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let via = tap(gw_addr, log.clone()).await;

    // A real terminal connects through the tap, opens a flow and sends a request.
    let sw = StopSwitch::default();
    let mut term = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    term.set_default_client_config(
        client_config(creds(&dir, "terminal").client_tls().unwrap(), &hop(), &sw).unwrap(),
    );
    let server = tokio::spawn({
        let gw = gw.clone();
        async move {
            let c = gw.accept().await.unwrap().await.unwrap();
            let (_s, mut r) = c.accept_bi().await.unwrap();
            let got = r.read_to_end(1 << 16).await.unwrap();
            (c, got)
        }
    });
    let conn = term.connect(via, "gateway").unwrap().await.unwrap();
    let (mut s, _r) = conn.open_bi().await.unwrap();
    s.write_all(b"flow header and request").await.unwrap();
    s.finish().unwrap();
    let (srv_conn, got) = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"flow header and request");
    conn.close(0u32.into(), b"done");
    srv_conn.closed().await;
    let recorded = log.lock().unwrap().clone();
    assert!(recorded.len() >= 3, "{} datagrams recorded", recorded.len());

    // Once the gateway has forgotten the connection (its draining period is 3 PTOs),
    // an attacker replays every datagram the terminal sent, from its own socket.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let replay = tokio::spawn(async move {
        for _ in 0..3 {
            for d in &recorded {
                let _ = attacker.send_to(d, gw_addr).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    // The gateway may begin a handshake for the replayed Initial, but never completes one:
    // the replayed Finished was made with keys of the old handshake.
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = attempts.clone();
    let accepted = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match gw.accept().await {
                Some(inc) => {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(4), inc).await {
                        return c.remote_address();
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
    })
    .await;
    replay.await.unwrap();
    assert!(
        accepted.is_err(),
        "a replayed handshake was accepted as a connection from {accepted:?}"
    );
    // The replay did reach the gateway, which began a handshake for it.
    assert!(
        attempts.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the replay never arrived"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_peer_without_a_certificate_is_refused() {
    let dir = keys("nocert");
    let gw = gateway(&dir);
    let gw_addr = gw.local_addr().unwrap();
    // Trusts the gateway's CA but presents no certificate of its own.
    let roots = creds(&dir, "terminal").roots;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![satpep_tunnel::keys::ALPN.to_vec()];
    let sw = StopSwitch::default();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client_config(tls, &hop(), &sw).unwrap());
    let server = tokio::spawn(async move {
        let inc = gw.accept().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), inc).await
    });
    // TLS 1.3: the client may finish its side before the gateway has checked it; then the
    // gateway closes the connection at once.
    let client = tokio::time::timeout(Duration::from_secs(5), async {
        if let Ok(c) = ep.connect(gw_addr, "gateway").unwrap().await {
            c.closed().await;
        }
    })
    .await;
    let srv = server.await.unwrap();
    assert!(
        !matches!(srv, Ok(Ok(_))),
        "the gateway accepted a peer without a certificate"
    );
    assert!(client.is_ok(), "the refused client hung");
    let _ = std::fs::remove_dir_all(&dir);
}
