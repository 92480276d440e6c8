"""Streaming voices behind one seam, one package per voice.

    base.py       the seam: SynthesizeSentence, DecodeWindow, WindowAudio (a window's answer), TTSAdapter
    segmenter.py  SentenceSegmenter: a session's text stream cut into sentences (every voice's default)
    graphemes.py  where a text may be cut without tearing a grapheme (the segmenter, a voice's front end)
    piper/        Piper's joe voice in torch (``piper-joe-medium``)
"""
