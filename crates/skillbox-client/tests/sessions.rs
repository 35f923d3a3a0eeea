//! The session calls against a server that speaks raw HTTP/1.1 on loopback: exec events
//! reach the caller while the body is still open, requests carry what the routes
//! expect, and error bodies come back as their code and message.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use skillbox_client::{
    ErrorCode, HttpSkillSandbox, SessionCreateRequest, SessionExecEvent, SessionExecRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the server read it: the head and the body.
struct Received {
    head: String,
    body: Vec<u8>,
}

async fn read_request(socket: &mut TcpStream) -> Received {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the client closed before its request was whole");
        bytes.extend_from_slice(&buf[..n]);
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    while bytes.len() < head_end + length {
        let n = socket.read(&mut buf).await.unwrap();
        bytes.extend_from_slice(&buf[..n]);
    }
    Received {
        head,
        body: bytes[head_end..head_end + length].to_vec(),
    }
}

/// A server that answers one request with `response` and hands the request back.
async fn answer_once(response: String) -> (String, tokio::task::JoinHandle<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let request = read_request(&mut socket).await;
        socket.write_all(response.as_bytes()).await.unwrap();
        socket.shutdown().await.unwrap();
        request
    });
    (base, task)
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

#[tokio::test]
async fn exec_events_arrive_while_the_body_is_still_open() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let request = read_request(&mut socket).await;
        let first = concat!(
            r#"{"type":"started","execId":"exe_7"}"#,
            "\n",
            r#"{"type":"stdout","data":"first\n"}"#,
            "\n",
            r#"{"type":"stderr","da"#
        );
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n";
        socket
            .write_all(format!("{head}{}", chunk(first)).as_bytes())
            .await
            .unwrap();
        // The rest only once the client has shown it read the first events.
        wait.await.unwrap();
        let rest = concat!(
            r#"ta":"warn\n"}"#,
            "\n",
            r#"{"type":"exit","exitCode":3,"signal":null,"timedOut":false,"limitHit":null,"durationMs":12,"truncated":{"stdout":false,"stderr":false},"cancelled":false}"#,
            "\n"
        );
        socket
            .write_all(format!("{}0\r\n\r\n", chunk(rest)).as_bytes())
            .await
            .unwrap();
        request
    });
    let client = HttpSkillSandbox::new(base).unwrap().with_api_key("tok");
    let request = SessionExecRequest {
        command: vec!["sh".into(), "-c".into(), "echo first".into()],
        ..SessionExecRequest::default()
    };
    let mut stream = client.sessions().exec("ses_1", &request).await.unwrap();
    let started = stream.next().await.unwrap().unwrap();
    assert_eq!(
        started,
        SessionExecEvent::Started {
            exec_id: "exe_7".into()
        }
    );
    assert_eq!(stream.exec_id(), Some("exe_7"));
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the first chunk came while the server held the rest back")
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        SessionExecEvent::Stdout {
            data: "first\n".into()
        }
    );
    go.send(()).unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        SessionExecEvent::Stderr {
            data: "warn\n".into()
        }
    );
    let exit = stream.next().await.unwrap().unwrap();
    assert_eq!(
        skillbox_client::exit_output(&exit).unwrap().shell_status(),
        3
    );
    assert!(stream.next().await.is_none(), "nothing after the exit");
    let received = server.await.unwrap();
    assert!(
        received
            .head
            .starts_with("POST /v1/sessions/ses_1/exec HTTP/1.1"),
        "{}",
        received.head
    );
    assert!(
        received
            .head
            .to_ascii_lowercase()
            .contains("authorization: bearer tok"),
        "{}",
        received.head
    );
    let body: serde_json::Value = serde_json::from_slice(&received.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"command":["sh","-c","echo first"],"stdinEncoding":"utf8"})
    );
}

#[tokio::test]
async fn a_stream_cut_before_its_exit_is_an_error_once() {
    let body = chunk(concat!(r#"{"type":"started","execId":"exe_1"}"#, "\n"));
    let (base, _server) = answer_once(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n{body}0\r\n\r\n"
    ))
    .await;
    let client = HttpSkillSandbox::new(base).unwrap();
    let mut stream = client
        .sessions()
        .exec("ses_1", &SessionExecRequest::default())
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Ok(SessionExecEvent::Started { .. }))
    ));
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(error.code, ErrorCode::Unavailable);
    assert!(error.message.contains("ended before"), "{error}");
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn an_error_answer_is_the_servers_code_and_message() {
    let body = r#"{"error":{"code":"not_found","message":"no session ses_gone (it ended, or it never was yours)"}}"#;
    let (base, server) = answer_once(format!(
        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
    .await;
    let client = HttpSkillSandbox::new(base).unwrap();
    let error = client.sessions().get("ses_gone").await.unwrap_err();
    assert_eq!(error.code, ErrorCode::NotFound);
    assert_eq!(
        error.message,
        "no session ses_gone (it ended, or it never was yours)"
    );
    assert!(
        server
            .await
            .unwrap()
            .head
            .starts_with("GET /v1/sessions/ses_gone HTTP/1.1")
    );
}

#[tokio::test]
async fn files_go_to_their_routes_encoded() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let (base, server) = answer_once(ok.to_string()).await;
    let client = HttpSkillSandbox::new(base).unwrap();
    client
        .sessions()
        .write_file(
            "ses_1",
            "/workspace/bin/a b.sh",
            b"#!/bin/sh\n".to_vec(),
            true,
        )
        .await
        .unwrap();
    let received = server.await.unwrap();
    assert!(
        received.head.starts_with(
            "PUT /v1/sessions/ses_1/files/workspace/bin/a%20b.sh?executable=true HTTP/1.1"
        ),
        "{}",
        received.head
    );
    assert_eq!(received.body, b"#!/bin/sh\n");

    let (base, server) = answer_once(ok.to_string()).await;
    let client = HttpSkillSandbox::new(base).unwrap();
    client
        .sessions()
        .remove_file("ses_1", "out", true)
        .await
        .unwrap();
    assert!(
        server
            .await
            .unwrap()
            .head
            .starts_with("DELETE /v1/sessions/ses_1/files/out?recursive=true HTTP/1.1")
    );

    let listing = r#"{"path":"a b","entries":[{"name":"x","kind":"file","size":3}]}"#;
    let (base, server) = answer_once(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{listing}",
        listing.len()
    ))
    .await;
    let client = HttpSkillSandbox::new(base).unwrap();
    let listed = client.sessions().ls("ses_1", Some("a b")).await.unwrap();
    assert_eq!(listed.entries[0].size, Some(3));
    assert!(
        server
            .await
            .unwrap()
            .head
            .starts_with("GET /v1/sessions/ses_1/ls?path=a+b HTTP/1.1")
    );

    // Refused before anything is sent: `..` would take the URL to another route.
    let client = HttpSkillSandbox::new("http://127.0.0.1:9").unwrap();
    let error = client
        .sessions()
        .read_file("ses_1", "a/../../ses_2/files/x")
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::Invalid);
    let error = client
        .sessions()
        .create(&SessionCreateRequest::default())
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::Unavailable, "{error}");
}
