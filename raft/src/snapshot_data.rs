//! [`SnapshotData`], the snapshot type openraft streams: a snapshot
//! file as the plain snapshot stream of [`crate::snapshot`], whatever the
//! file's form on disk.
//!
//! On a node without a key it is the file itself. On a node with one the
//! file is sealed ([`crate::sealed_snapshot`]): reads open blocks and
//! writes seal them, on tokio's blocking threads. openraft sends a
//! snapshot to a follower by reading it in chunks, so the plain stream
//! goes over the connection (TLS protects it there), and the follower
//! writes the chunks into a snapshot file of its own form, sealed with
//! its own key. Nodes of one cluster need not share a key, or have one.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use okaywal::encryption::Cipher;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tokio::task::JoinHandle;

use crate::sealed_snapshot::{SealedSnapshotReader, SealedSnapshotWriter};

/// The most bytes one write hands to a blocking thread.
const MAX_WRITE: usize = 4 << 20;

/// A snapshot file as openraft reads and writes it (the `SnapshotData` of
/// [`crate::TypeConfig`]): the plain snapshot stream, from a plain file
/// or through a sealed one.
pub struct SnapshotData {
    path: Option<PathBuf>,
    io: Io,
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotData")
            .field("path", &self.path)
            .field("sealed", &matches!(self.io, Io::Sealed(_)))
            .finish()
    }
}

enum Io {
    Plain(tokio::fs::File),
    Sealed(Sealed),
}

/// What a [`SnapshotData`] is made of, once every operation on it has
/// finished.
#[derive(Debug)]
pub enum SnapshotParts {
    /// A plain file.
    Plain(std::fs::File),
    /// A sealed file being read.
    SealedReader(SealedSnapshotReader),
    /// A sealed file being written (not finished: its last block is still
    /// to seal).
    SealedWriter(SealedSnapshotWriter),
}

impl SnapshotData {
    /// A plain snapshot file, `path` if it is known.
    #[must_use]
    pub fn plain(file: tokio::fs::File, path: Option<PathBuf>) -> Self {
        Self {
            path,
            io: Io::Plain(file),
        }
    }

    /// Opens the snapshot file at `path` for reading: plain, or sealed if
    /// `cipher` is given.
    ///
    /// # Errors
    ///
    /// The file does not open; for a sealed one, as
    /// [`SealedSnapshotReader::open`].
    pub async fn open(path: &Path, cipher: Option<&Cipher>) -> io::Result<Self> {
        match cipher {
            None => Ok(Self::plain(
                tokio::fs::File::open(path).await?,
                Some(path.to_path_buf()),
            )),
            Some(cipher) => {
                let (owned, cipher) = (path.to_path_buf(), cipher.clone());
                let reader = tokio::task::spawn_blocking(move || {
                    SealedSnapshotReader::open(&owned, &cipher)
                })
                .await
                .map_err(io::Error::other)??;
                Ok(Self::sealed(Blocking::Reader(reader), path))
            }
        }
    }

    /// Creates the snapshot file `path` for writing: plain, or sealed if
    /// `cipher` is given.
    ///
    /// # Errors
    ///
    /// The file cannot be created (or its header written).
    pub async fn create(path: &Path, cipher: Option<&Cipher>) -> io::Result<Self> {
        match cipher {
            None => {
                let file = tokio::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .await?;
                Ok(Self::plain(file, Some(path.to_path_buf())))
            }
            Some(cipher) => {
                let (owned, cipher) = (path.to_path_buf(), cipher.clone());
                let writer = tokio::task::spawn_blocking(move || {
                    SealedSnapshotWriter::create(&owned, &cipher)
                })
                .await
                .map_err(io::Error::other)??;
                Ok(Self::sealed(Blocking::Writer(writer), path))
            }
        }
    }

    fn sealed(blocking: Blocking, path: &Path) -> Self {
        Self {
            path: Some(path.to_path_buf()),
            io: Io::Sealed(Sealed {
                state: State::Idle(Box::new(blocking)),
                leftover: Vec::new(),
                leftover_at: 0,
                eof: false,
                deferred: None,
            }),
        }
    }

    /// The file's path, if known.
    #[must_use]
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the file is sealed.
    #[must_use]
    pub fn is_sealed(&self) -> bool {
        matches!(self.io, Io::Sealed(_))
    }

    /// Waits for every operation to finish and returns the file, or the
    /// error of a write that had not been reported yet.
    ///
    /// # Errors
    ///
    /// The first failed write's error, or a failed blocking task's.
    pub async fn into_parts(self) -> io::Result<(Option<PathBuf>, SnapshotParts)> {
        match self.io {
            Io::Plain(file) => Ok((self.path, SnapshotParts::Plain(file.into_std().await))),
            Io::Sealed(mut sealed) => {
                std::future::poll_fn(|cx| sealed.poll_settle(cx)).await?;
                let State::Idle(blocking) = sealed.state else {
                    return Err(gone());
                };
                Ok((
                    self.path,
                    match *blocking {
                        Blocking::Reader(reader) => SnapshotParts::SealedReader(reader),
                        Blocking::Writer(writer) => SnapshotParts::SealedWriter(writer),
                    },
                ))
            }
        }
    }
}

enum Blocking {
    Reader(SealedSnapshotReader),
    Writer(SealedSnapshotWriter),
}

impl Blocking {
    fn read(&mut self, max: usize) -> io::Result<Vec<u8>> {
        match self {
            Blocking::Reader(reader) => reader.read_chunk(max),
            Blocking::Writer(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a snapshot being received cannot be read",
            )),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Blocking::Writer(writer) => std::io::Write::write_all(writer, bytes),
            Blocking::Reader(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a snapshot being sent cannot be written",
            )),
        }
    }

    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match self {
            Blocking::Reader(reader) => std::io::Seek::seek(reader, pos),
            Blocking::Writer(writer) => {
                let end = writer.position();
                let target = match pos {
                    SeekFrom::Start(at) => Some(at),
                    SeekFrom::End(delta) | SeekFrom::Current(delta) => {
                        end.checked_add_signed(delta)
                    }
                };
                let target = target.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "seek before the start")
                })?;
                writer.rewind(target)
            }
        }
    }

    fn position(&self) -> u64 {
        match self {
            Blocking::Reader(reader) => reader.position(),
            Blocking::Writer(writer) => writer.position(),
        }
    }
}

enum Done {
    Read(io::Result<Vec<u8>>),
    Wrote(io::Result<()>),
    Sought(io::Result<u64>),
}

enum State {
    Idle(Box<Blocking>),
    Busy(JoinHandle<(Box<Blocking>, Done)>),
    /// A blocking task panicked or was cancelled.
    Gone,
}

struct Sealed {
    state: State,
    /// Bytes read ahead of the caller (the blocking side's position is past
    /// them).
    leftover: Vec<u8>,
    leftover_at: usize,
    /// The last read found the end.
    eof: bool,
    /// The error of a write that returned before it was done, for the next
    /// call to report.
    deferred: Option<io::Error>,
}

fn gone() -> io::Error {
    io::Error::other("a snapshot file task failed")
}

impl Sealed {
    fn leftover_len(&self) -> usize {
        self.leftover.len() - self.leftover_at
    }

    fn poll_busy(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Done>>> {
        match &mut self.state {
            State::Idle(_) => Poll::Ready(Ok(None)),
            State::Gone => Poll::Ready(Err(gone())),
            State::Busy(handle) => match ready!(Pin::new(handle).poll(cx)) {
                Ok((blocking, done)) => {
                    self.state = State::Idle(blocking);
                    Poll::Ready(Ok(Some(done)))
                }
                Err(_) => {
                    self.state = State::Gone;
                    Poll::Ready(Err(gone()))
                }
            },
        }
    }

    /// Keeps what a finished operation produced; returns a seek's result.
    fn absorb(&mut self, done: Done) -> Option<io::Result<u64>> {
        match done {
            Done::Read(Ok(bytes)) => {
                if bytes.is_empty() {
                    self.eof = true;
                } else {
                    self.leftover = bytes;
                    self.leftover_at = 0;
                }
                None
            }
            Done::Read(Err(error)) | Done::Wrote(Err(error)) => {
                self.deferred.get_or_insert(error);
                None
            }
            Done::Wrote(Ok(())) => None,
            Done::Sought(result) => Some(result),
        }
    }

    fn spawn(
        &mut self,
        work: impl FnOnce(&mut Blocking) -> Done + Send + 'static,
    ) -> io::Result<()> {
        match std::mem::replace(&mut self.state, State::Gone) {
            State::Idle(mut blocking) => {
                self.state = State::Busy(tokio::task::spawn_blocking(move || {
                    let done = work(&mut blocking);
                    (blocking, done)
                }));
                Ok(())
            }
            State::Busy(handle) => {
                self.state = State::Busy(handle);
                Err(io::Error::other(
                    "another operation on the snapshot file is in progress",
                ))
            }
            State::Gone => Err(gone()),
        }
    }

    /// Waits for the operation in progress; reports a deferred error.
    fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(error) = self.deferred.take() {
                return Poll::Ready(Err(error));
            }
            match ready!(self.poll_busy(cx))? {
                Some(done) => {
                    self.absorb(done);
                }
                None => return Poll::Ready(Ok(())),
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.leftover_len() > 0 {
                let n = self.leftover_len().min(buf.remaining());
                buf.put_slice(&self.leftover[self.leftover_at..self.leftover_at + n]);
                self.leftover_at += n;
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = self.deferred.take() {
                return Poll::Ready(Err(error));
            }
            if self.eof {
                self.eof = false;
                return Poll::Ready(Ok(()));
            }
            match ready!(self.poll_busy(cx))? {
                Some(done) => {
                    self.absorb(done);
                }
                None => {
                    let want = buf.remaining();
                    self.spawn(move |b| Done::Read(b.read(want)))?;
                }
            }
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.poll_settle(cx))?;
        self.leftover.clear();
        self.leftover_at = 0;
        self.eof = false;
        let n = buf.len().min(MAX_WRITE);
        let bytes = buf[..n].to_vec();
        self.spawn(move |b| Done::Wrote(b.write(&bytes)))?;
        Poll::Ready(Ok(n))
    }

    fn start_seek(&mut self, pos: SeekFrom) -> io::Result<()> {
        let behind = self.leftover_len() as i64;
        self.leftover.clear();
        self.leftover_at = 0;
        self.eof = false;
        let pos = match pos {
            SeekFrom::Current(delta) => SeekFrom::Current(delta - behind),
            other => other,
        };
        self.spawn(move |b| Done::Sought(b.seek(pos)))
    }

    fn poll_complete(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        loop {
            if let Some(error) = self.deferred.take() {
                return Poll::Ready(Err(error));
            }
            match ready!(self.poll_busy(cx))? {
                Some(done) => {
                    if let Some(result) = self.absorb(done) {
                        if let Some(error) = self.deferred.take() {
                            return Poll::Ready(Err(error));
                        }
                        return Poll::Ready(result);
                    }
                }
                None => {
                    let State::Idle(blocking) = &self.state else {
                        return Poll::Ready(Err(gone()));
                    };
                    return Poll::Ready(Ok(blocking.position() - self.leftover_len() as u64));
                }
            }
        }
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).poll_read(cx, buf),
            Io::Sealed(sealed) => sealed.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).poll_write(cx, buf),
            Io::Sealed(sealed) => sealed.poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).poll_flush(cx),
            Io::Sealed(sealed) => sealed.poll_settle(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).poll_shutdown(cx),
            Io::Sealed(sealed) => sealed.poll_settle(cx),
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).start_seek(position),
            Io::Sealed(sealed) => sealed.start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match &mut self.get_mut().io {
            Io::Plain(file) => Pin::new(file).poll_complete(cx),
            Io::Sealed(sealed) => sealed.poll_complete(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use okaywal::encryption::StaticKey;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    /// openraft's way: the sender seeks to each chunk and reads it; the
    /// receiver seeks (when a chunk is sent again) and writes it.
    #[tokio::test]
    async fn chunks_stream_out_of_and_into_sealed_files() {
        let dir = tempfile::tempdir().unwrap();
        let cipher = Cipher::new(StaticKey::new([5; 32]));
        let stream: Vec<u8> = (0..300_000_u32).map(|i| (i % 251) as u8).collect();
        let source = dir.path().join("source");
        let mut writer = SealedSnapshotWriter::create(&source, &cipher).unwrap();
        std::io::Write::write_all(&mut writer, &stream).unwrap();
        writer.finish().unwrap();

        let mut out = SnapshotData::open(&source, Some(&cipher)).await.unwrap();
        let end = out.seek(SeekFrom::End(0)).await.unwrap();
        assert_eq!(end, stream.len() as u64);
        let mut into = SnapshotData::create(&dir.path().join("copy"), Some(&cipher))
            .await
            .unwrap();
        let chunk = 70_001;
        let mut offset = 0;
        let mut sent_again = false;
        while offset < end {
            out.seek(SeekFrom::Start(offset)).await.unwrap();
            let mut buf = Vec::with_capacity(chunk);
            while buf.len() < chunk {
                if out.read_buf(&mut buf).await.unwrap() == 0 {
                    break;
                }
            }
            assert_eq!(
                &buf[..],
                &stream[offset as usize..offset as usize + buf.len()]
            );
            into.seek(SeekFrom::Start(offset)).await.unwrap();
            into.write_all(&buf).await.unwrap();
            if offset > 100_000 && !sent_again {
                sent_again = true;
                continue;
            }
            offset += buf.len() as u64;
        }
        let (path, parts) = into.into_parts().await.unwrap();
        let SnapshotParts::SealedWriter(writer) = parts else {
            panic!("a sealed writer")
        };
        writer.finish().unwrap();
        let mut copy = Vec::new();
        std::io::Read::read_to_end(
            &mut SealedSnapshotReader::open(&path.unwrap(), &cipher).unwrap(),
            &mut copy,
        )
        .unwrap();
        assert_eq!(copy, stream);
    }

    #[tokio::test]
    async fn reading_a_damaged_block_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cipher = Cipher::new(StaticKey::new([5; 32]));
        let path = dir.path().join("s");
        let mut writer = SealedSnapshotWriter::create(&path, &cipher).unwrap();
        std::io::Write::write_all(&mut writer, &[9; 200_000]).unwrap();
        writer.finish().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 10;
        bytes[at] ^= 4;
        std::fs::write(&path, &bytes).unwrap();
        let mut data = SnapshotData::open(&path, Some(&cipher)).await.unwrap();
        let mut all = Vec::new();
        let error = data.read_to_end(&mut all).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("block 3"), "{error}");
    }
}
